#include "textflag.h"

// func commaMasksAVX2(p unsafe.Pointer, n int, masks *uint64) int
//
// For each of up to n blocks of 64 bytes from p: the bytes equal to ','
// (VPCMPEQB, VPMOVMSKB: one bit per byte) become masks[g], unless the
// block holds a byte that is neither a comma nor a digit ('0' <= x <= '9':
// x-'0', as an unsigned byte, is at most 9), where it stops. Returns the
// number of blocks written.
TEXT ·commaMasksAVX2(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ masks+16(FP), DI
	XORQ AX, AX
	MOVQ $0x2C2C2C2C2C2C2C2C, DX
	MOVQ DX, X10
	VPBROADCASTQ X10, Y10
	MOVQ $0x3030303030303030, DX
	MOVQ DX, X11
	VPBROADCASTQ X11, Y11
	MOVQ $0x0909090909090909, DX
	MOVQ DX, X12
	VPBROADCASTQ X12, Y12

loop:
	CMPQ AX, CX
	JGE  done
	VMOVDQU (SI), Y0
	VMOVDQU 32(SI), Y1
	VPCMPEQB Y10, Y0, Y2   // commas
	VPCMPEQB Y10, Y1, Y3
	VPSUBB   Y11, Y0, Y4   // x - '0'
	VPSUBB   Y11, Y1, Y5
	VPMINUB  Y12, Y4, Y6   // min(x - '0', 9)
	VPMINUB  Y12, Y5, Y7
	VPCMPEQB Y6, Y4, Y4    // a digit: x - '0' <= 9
	VPCMPEQB Y7, Y5, Y5
	VPOR     Y2, Y4, Y4    // a digit or a comma
	VPOR     Y3, Y5, Y5
	VPAND    Y5, Y4, Y4
	VPMOVMSKB Y4, R8
	CMPL     R8, $-1
	JNE      done
	VPMOVMSKB Y2, R8
	VPMOVMSKB Y3, R9
	SHLQ     $32, R9
	ORQ      R9, R8
	MOVQ     R8, (DI)(AX*8)
	ADDQ     $64, SI
	INCQ     AX
	JMP      loop

done:
	VZEROUPPER
	MOVQ AX, ret+24(FP)
	RET
