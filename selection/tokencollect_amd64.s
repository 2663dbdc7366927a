#include "textflag.h"

// func collectCompactBMI(base unsafe.Pointer, masks *uint64, n int, c int, start int, words *uint64) (next int, m int, ok bool)
//
// collectCompact (tokenrun.go) over masks[0:n]: for each comma of each
// mask, the element from start to it (one to eight bytes, no leading zero
// unless it is "0") is loaded as eight bytes from base+start and shifted
// left so that its digits fill the top bytes, into words[m]; start moves
// past the comma. An element that fails stops it, with next at its start
// and ok false. TZCNT, BLSR and SHLX (BMI1 and BMI2) keep the loop to the
// few instructions an element needs: the compiler's code for the same loop
// (GOAMD64=v1) has no BLSR or SHLX, and moves the shift count through CX.
TEXT ·collectCompactBMI(SB), NOSPLIT, $0-65
	MOVQ base+0(FP), AX
	MOVQ masks+8(FP), BX
	MOVQ n+16(FP), CX
	MOVQ c+24(FP), SI
	MOVQ start+32(FP), R8
	MOVQ words+40(FP), R9
	XORQ DI, DI // m
	TESTQ CX, CX
	JLE  done

block:
	MOVQ (BX), R10 // the block's comma mask
	ADDQ $8, BX
	TESTQ R10, R10
	JZ   nextBlock

element:
	TZCNTQ R10, R11 // the next comma, in the block
	BLSRQ  R10, R10
	ADDQ   SI, R11 // end: the comma's offset
	MOVQ   R11, R12
	SUBQ   R8, R12 // n: the element's length
	LEAQ   -1(R12), R13
	CMPQ   R13, $7
	JA     fail // empty, or over eight digits
	MOVQ   (AX)(R8*1), R14
	CMPB   R14, $0x30
	JEQ    zero

take:
	SHLQ  $3, R12
	NEGQ  R12 // 64-8n, as SHLX reads it (mod 64)
	SHLXQ R12, R14, R14
	MOVQ  R14, (R9)(DI*8)
	INCQ  DI
	LEAQ  1(R11), R8 // start: past the comma
	TESTQ R10, R10
	JNZ   element

nextBlock:
	ADDQ $64, SI
	DECQ CX
	JNZ  block

done:
	MOVQ R8, next+48(FP)
	MOVQ DI, m+56(FP)
	MOVB $1, ok+64(FP)
	RET

zero:
	CMPQ R12, $1 // "0" alone is an element; a leading zero is not
	JEQ  take

fail:
	MOVQ R8, next+48(FP)
	MOVQ DI, m+56(FP)
	MOVB $0, ok+64(FP)
	RET
