#include "textflag.h"

// func collectValuesVBMI(base unsafe.Pointer, masks *uint64, n int, c int, start int, dst *uint32) (next int, m int, done int)
//
// collectCompact (tokenrun.go) and digitValues in one, a block of 64
// bytes at a time in AVX-512 VBMI and VBMI2, for blocks whose elements all
// pass collectCompact's checks: it stops before the first block that has
// more than 16 elements, an element that fails a check, or an element that
// began more than seven bytes before the block, and returns how many blocks
// it took (done); the caller takes the rest with the checking loop, from
// next. Per block: the commas' offsets are packed into bytes (VPCOMPRESSB
// of the offsets under the comma mask), each element's start is the comma
// before it plus one, and its length their difference; the lengths (one
// to eight) and the first digits (a leading zero only in "0") are checked
// sixteen elements at once; then each element's bytes are gathered into
// the top of its own eight-byte word (VPERMI2B over the 72 bytes from
// eight before the block, zero below the element's first digit), as
// parseDigits's shift leaves them, eight words a register, and converted
// to numbers as digitValuesAVX2 does, eight at once, into dst[m:].
// It reads the eight bytes before the block: the caller guarantees c >= 8.
// It writes sixteen values a block taken, the ones past the block's
// elements meaningless: the caller guarantees the room.
// VALUES converts the eight words of w (one to eight ASCII digits in
// their top bytes, zero below) to their numbers, as digitValuesAVX2 does
// four at a time, into the eight 32-bit lanes of out; t is clobbered.
#define VALUES(w, t, out) \
	VPANDQ     Z30, w, w; \
	VPMADDUBSW Z31, w, w; \
	VPMADDWD   Z19, w, w; \
	VPMULUDQ   Z18, w, t; \
	VPSRLQ     $32, w, w; \
	VPADDQ     t, w, w; \
	VPMOVQD    w, out

TEXT ·collectValuesVBMI(SB), NOSPLIT, $0-72
	MOVQ base+0(FP), AX
	MOVQ masks+8(FP), BX
	MOVQ n+16(FP), CX
	MOVQ c+24(FP), SI
	MOVQ start+32(FP), R8
	MOVQ dst+40(FP), R9
	XORQ DI, DI // m
	XORQ DX, DX // blocks taken
	TESTQ CX, CX
	JLE  out

	VMOVDQU64 vbmiOffsets<>(SB), Z20  // byte j: j+8, its place in the window
	VMOVDQU64 vbmiPrev<>(SB), Z21     // byte j: j-1 (byte 0: 0)
	VMOVDQU64 vbmiLane0<>(SB), Z22    // byte j: j/8, lane j/8's element
	VMOVDQU64 vbmiLane1<>(SB), Z23    // byte j: 8+j/8
	VMOVDQU64 vbmiBelow<>(SB), Z24    // byte j: j%8 - 8 (mod 256)
	VMOVDQU64 vbmiInLane<>(SB), Z25   // byte j: j%8
	MOVQ $0x0808080808080808, R10
	VPBROADCASTQ R10, Z26
	MOVQ $0x0101010101010101, R10
	VPBROADCASTQ R10, Z27
	MOVQ $0x0707070707070707, R10
	VPBROADCASTQ R10, Z28
	MOVQ $0x3030303030303030, R10
	VPBROADCASTQ R10, Z29
	MOVQ $1, R10
	KMOVQ R10, K2 // byte 0
	MOVQ $0x0F0F0F0F0F0F0F0F, R10
	VPBROADCASTQ R10, Z30
	MOVQ $0x010A010A010A010A, R10 // byte weights 10, 1
	VPBROADCASTQ R10, Z31
	MOVQ $0x0001006400010064, R10 // word weights 100, 1
	VPBROADCASTQ R10, Z19
	MOVQ $10000, R10
	VPBROADCASTQ R10, Z18

block:
	MOVQ (BX), R10 // the block's comma mask
	TESTQ R10, R10
	JZ   next      // no comma: the element goes on (and fails later)
	POPCNTQ R10, R12
	CMPQ R12, $16
	JA   out       // more than sixteen elements end here
	MOVQ SI, R13
	SUBQ R8, R13   // how far before the block the element began
	CMPQ R13, $7
	JA   out       // over seven bytes: too long, the checking loop says so

	VMOVDQU64 -8(AX)(SI*1), Z0 // window bytes 0-63: from c-8
	MOVQ      56(AX)(SI*1), X1 // window bytes 64-71: to the block's end
	KMOVQ     R10, K1
	VPCOMPRESSB.Z Z20, K1, Z2  // E: the commas' places, packed
	VPERMB    Z2, Z21, Z3      // the comma before each
	VPADDB    Z27, Z3, Z3      // S: each element's first place
	MOVQ      $8, R14
	SUBQ      R13, R14
	VPBROADCASTB R14, K2, Z3   // the first element's, from start
	VPSUBB    Z3, Z2, Z4       // L = E - S: the lengths
	MOVQ      $-1, R15
	BZHIQ     R12, R15, R15
	KMOVQ     R15, K3          // the block's elements' lanes
	VPSUBB    Z27, Z4, Z5
	VPCMPUB   $6, Z28, Z5, K3, K4 // L-1 > 7: empty, or over eight digits
	KORTESTQ  K4, K4
	JNZ       out
	VMOVDQA64 Z3, Z6
	VPERMI2B  Z1, Z0, Z6       // each element's first digit
	VPCMPEQB  Z29, Z6, K3, K5  // a '0'
	VPCMPUB   $4, Z27, Z4, K5, K5 // not alone: a leading zero
	KORTESTQ  K5, K5
	JNZ       out

	// Elements 0-7: lane j's byte k is window[E_j-8+k] where k >= 8-L_j,
	// else zero; then their values.
	VPERMB    Z2, Z22, Z7
	VPERMB    Z4, Z22, Z8
	VPADDB    Z24, Z7, Z7
	VPADDB    Z25, Z8, Z8
	VPCMPUB   $5, Z26, Z8, K6  // L_j + k >= 8
	VPERMI2B.Z Z1, Z0, K6, Z7
	VALUES(Z7, Z9, Y7)
	VMOVDQU   Y7, (R9)(DI*4)
	// Elements 8-15, whether or not the block has them: a test would
	// cost more, mispredicted, than the few instructions.
	VPERMB    Z2, Z23, Z7
	VPERMB    Z4, Z23, Z8
	VPADDB    Z24, Z7, Z7
	VPADDB    Z25, Z8, Z8
	VPCMPUB   $5, Z26, Z8, K6
	VPERMI2B.Z Z1, Z0, K6, Z7
	VALUES(Z7, Z9, Y7)
	VMOVDQU   Y7, 32(R9)(DI*4)

taken:
	ADDQ R12, DI
	BSRQ R10, R11  // the last comma
	LEAQ 1(SI)(R11*1), R8

next:
	ADDQ $64, SI
	ADDQ $8, BX
	INCQ DX
	CMPQ DX, CX
	JLT  block

out:
	VZEROUPPER
	MOVQ R8, next+48(FP)
	MOVQ DI, m+56(FP)
	MOVQ DX, done+64(FP)
	RET

DATA vbmiOffsets<>+0(SB)/8, $0x0f0e0d0c0b0a0908
DATA vbmiOffsets<>+8(SB)/8, $0x1716151413121110
DATA vbmiOffsets<>+16(SB)/8, $0x1f1e1d1c1b1a1918
DATA vbmiOffsets<>+24(SB)/8, $0x2726252423222120
DATA vbmiOffsets<>+32(SB)/8, $0x2f2e2d2c2b2a2928
DATA vbmiOffsets<>+40(SB)/8, $0x3736353433323130
DATA vbmiOffsets<>+48(SB)/8, $0x3f3e3d3c3b3a3938
DATA vbmiOffsets<>+56(SB)/8, $0x4746454443424140
GLOBL vbmiOffsets<>(SB), RODATA|NOPTR, $64

DATA vbmiPrev<>+0(SB)/8, $0x0605040302010000
DATA vbmiPrev<>+8(SB)/8, $0x0e0d0c0b0a090807
DATA vbmiPrev<>+16(SB)/8, $0x161514131211100f
DATA vbmiPrev<>+24(SB)/8, $0x1e1d1c1b1a191817
DATA vbmiPrev<>+32(SB)/8, $0x262524232221201f
DATA vbmiPrev<>+40(SB)/8, $0x2e2d2c2b2a292827
DATA vbmiPrev<>+48(SB)/8, $0x363534333231302f
DATA vbmiPrev<>+56(SB)/8, $0x3e3d3c3b3a393837
GLOBL vbmiPrev<>(SB), RODATA|NOPTR, $64

DATA vbmiLane0<>+0(SB)/8, $0x0000000000000000
DATA vbmiLane0<>+8(SB)/8, $0x0101010101010101
DATA vbmiLane0<>+16(SB)/8, $0x0202020202020202
DATA vbmiLane0<>+24(SB)/8, $0x0303030303030303
DATA vbmiLane0<>+32(SB)/8, $0x0404040404040404
DATA vbmiLane0<>+40(SB)/8, $0x0505050505050505
DATA vbmiLane0<>+48(SB)/8, $0x0606060606060606
DATA vbmiLane0<>+56(SB)/8, $0x0707070707070707
GLOBL vbmiLane0<>(SB), RODATA|NOPTR, $64

DATA vbmiLane1<>+0(SB)/8, $0x0808080808080808
DATA vbmiLane1<>+8(SB)/8, $0x0909090909090909
DATA vbmiLane1<>+16(SB)/8, $0x0a0a0a0a0a0a0a0a
DATA vbmiLane1<>+24(SB)/8, $0x0b0b0b0b0b0b0b0b
DATA vbmiLane1<>+32(SB)/8, $0x0c0c0c0c0c0c0c0c
DATA vbmiLane1<>+40(SB)/8, $0x0d0d0d0d0d0d0d0d
DATA vbmiLane1<>+48(SB)/8, $0x0e0e0e0e0e0e0e0e
DATA vbmiLane1<>+56(SB)/8, $0x0f0f0f0f0f0f0f0f
GLOBL vbmiLane1<>(SB), RODATA|NOPTR, $64

DATA vbmiBelow<>+0(SB)/8, $0xfffefdfcfbfaf9f8
DATA vbmiBelow<>+8(SB)/8, $0xfffefdfcfbfaf9f8
DATA vbmiBelow<>+16(SB)/8, $0xfffefdfcfbfaf9f8
DATA vbmiBelow<>+24(SB)/8, $0xfffefdfcfbfaf9f8
DATA vbmiBelow<>+32(SB)/8, $0xfffefdfcfbfaf9f8
DATA vbmiBelow<>+40(SB)/8, $0xfffefdfcfbfaf9f8
DATA vbmiBelow<>+48(SB)/8, $0xfffefdfcfbfaf9f8
DATA vbmiBelow<>+56(SB)/8, $0xfffefdfcfbfaf9f8
GLOBL vbmiBelow<>(SB), RODATA|NOPTR, $64

DATA vbmiInLane<>+0(SB)/8, $0x0706050403020100
DATA vbmiInLane<>+8(SB)/8, $0x0706050403020100
DATA vbmiInLane<>+16(SB)/8, $0x0706050403020100
DATA vbmiInLane<>+24(SB)/8, $0x0706050403020100
DATA vbmiInLane<>+32(SB)/8, $0x0706050403020100
DATA vbmiInLane<>+40(SB)/8, $0x0706050403020100
DATA vbmiInLane<>+48(SB)/8, $0x0706050403020100
DATA vbmiInLane<>+56(SB)/8, $0x0706050403020100
GLOBL vbmiInLane<>(SB), RODATA|NOPTR, $64
