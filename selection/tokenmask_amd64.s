#include "textflag.h"

// func commaMasksAVX2(p unsafe.Pointer, n int, masks *uint64, carry uint64) (int, bool)
//
// For each of up to n blocks of 64 bytes from p: the bytes equal to ','
// (VPCMPEQB, VPMOVMSKB: one bit per byte) become masks[g], unless the
// block holds a byte that is neither a comma, a space nor a digit
// ('0' <= x <= '9': x-'0', as an unsigned byte, is at most 9), or a space
// that does not directly follow a comma (carry: the byte before p is
// one), where it stops. Returns the number of blocks written and whether
// they hold a space.
TEXT ·commaMasksAVX2(SB), NOSPLIT, $0-41
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ masks+16(FP), DI
	MOVQ carry+24(FP), BX
	XORQ AX, AX
	XORQ R12, R12 // the space masks written, ORed
	MOVQ $0x2C2C2C2C2C2C2C2C, DX
	MOVQ DX, X10
	VPBROADCASTQ X10, Y10
	MOVQ $0x3030303030303030, DX
	MOVQ DX, X11
	VPBROADCASTQ X11, Y11
	MOVQ $0x0909090909090909, DX
	MOVQ DX, X12
	VPBROADCASTQ X12, Y12
	MOVQ $0x2020202020202020, DX
	MOVQ DX, X13
	VPBROADCASTQ X13, Y13

loop:
	CMPQ AX, CX
	JGE  done
	VMOVDQU (SI), Y0
	VMOVDQU 32(SI), Y1
	VPCMPEQB Y10, Y0, Y2   // commas
	VPCMPEQB Y10, Y1, Y3
	VPSUBB   Y11, Y0, Y4   // x - '0'
	VPSUBB   Y11, Y1, Y5
	VPMINUB  Y12, Y4, Y8   // min(x - '0', 9)
	VPMINUB  Y12, Y5, Y9
	VPCMPEQB Y8, Y4, Y4    // a digit: x - '0' <= 9
	VPCMPEQB Y9, Y5, Y5
	VPOR     Y2, Y4, Y4    // a digit or a comma
	VPOR     Y3, Y5, Y5
	VPAND    Y5, Y4, Y8
	VPMOVMSKB Y8, R8
	CMPL     R8, $-1
	JNE      spaced        // something else: spaces, or the end of the run

store:
	VPMOVMSKB Y2, R8       // the comma mask
	VPMOVMSKB Y3, R9
	SHLQ     $32, R9
	ORQ      R9, R8
	MOVQ     R8, (DI)(AX*8)
	MOVQ     R8, BX        // the next block's carry
	SHRQ     $63, BX
	ADDQ     $64, SI
	INCQ     AX
	JMP      loop

spaced:
	VPCMPEQB Y13, Y0, Y6   // spaces
	VPCMPEQB Y13, Y1, Y7
	VPOR     Y6, Y4, Y4    // a digit, a comma or a space
	VPOR     Y7, Y5, Y5
	VPAND    Y5, Y4, Y4
	VPMOVMSKB Y4, R8
	CMPL     R8, $-1
	JNE      done
	VPMOVMSKB Y6, R10      // the space mask
	VPMOVMSKB Y7, R9
	SHLQ     $32, R9
	ORQ      R9, R10
	VPMOVMSKB Y2, R8       // the bytes after a comma
	VPMOVMSKB Y3, R9
	SHLQ     $32, R9
	ORQ      R9, R8
	SHLQ     $1, R8
	ORQ      BX, R8
	NOTQ     R8
	TESTQ    R8, R10       // a space anywhere else
	JNE      done
	ORQ      R10, R12
	JMP      store

done:
	VZEROUPPER
	MOVQ AX, ret+32(FP)
	TESTQ R12, R12
	SETNE ret1+40(FP)
	RET

// func digitValuesAVX2(words *uint64, n int, dst *uint32)
//
// For each of n (a multiple of 4) words holding one to eight ASCII digits
// in their top bytes, the most significant first, and zero bytes below
// (parseDigits's first step): the number, to dst. Four at a time: the
// digits' values (AND 0x0F), then pairs, fours and eights combined by
// multiply-adds (x10, x100, x10000), then the four 32-bit results packed.
TEXT ·digitValuesAVX2(SB), NOSPLIT, $0-24
	MOVQ words+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ dst+16(FP), DI
	MOVQ $0x0F0F0F0F0F0F0F0F, DX
	MOVQ DX, X10
	VPBROADCASTQ X10, Y10
	MOVQ $0x010A010A010A010A, DX // byte weights 10, 1
	MOVQ DX, X11
	VPBROADCASTQ X11, Y11
	MOVQ $0x0001006400010064, DX // word weights 100, 1
	MOVQ DX, X12
	VPBROADCASTQ X12, Y12
	MOVQ $10000, DX
	MOVQ DX, X13
	VPBROADCASTQ X13, Y13

values:
	CMPQ CX, $4
	JLT  valuesDone
	VMOVDQU    (SI), Y0
	VPAND      Y10, Y0, Y0
	VPMADDUBSW Y11, Y0, Y0 // two digits: 16 bits
	VPMADDWD   Y12, Y0, Y0 // four digits: 32 bits
	VPMULUDQ   Y13, Y0, Y1 // the first four, times 10000
	VPSRLQ     $32, Y0, Y0 // the last four
	VPADDQ     Y1, Y0, Y0
	VPSHUFD    $0x08, Y0, Y0 // each lane's two results to its low 64 bits
	VPERMQ     $0x08, Y0, Y0 // both lanes' to the low 128 bits
	VMOVDQU    X0, (DI)
	ADDQ       $32, SI
	ADDQ       $16, DI
	SUBQ       $4, CX
	JMP        values

valuesDone:
	VZEROUPPER
	RET
