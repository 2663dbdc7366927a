#include "textflag.h"

// func readIDBlocksVBMI(out []uint32, b []byte, k, i int) (int, int)
//
// The bulk of a run of 0xcd/0xce token ids, 64 bytes of b at a time in
// AVX-512 VBMI: from id k at byte i, it takes quads the Go loop
// (readIDQuads) would take and returns a place that loop passes through,
// which readIDQuadsVBMI and the loop go on from.
//
// readIDQuadsVBMI's steps wait for each other: where one starts is known
// only at the end of the one before. Here the blocks are fixed (i, i+64,
// …), and what a block hands on to the next, the offset of its first
// header in it (0-4), is one byte permute of the last: per block, with
// next[j] = j + 5 - 2·(b[j]&1) as there but places past the block kept as
// they are (a second table of 64+j), next³² maps each entry offset to the
// first place past the block, so the next block's offset is next³²[c]-64,
// computed before c is known. From c, the block's headers P[k] = next^k(c)
// (32 lanes: a block holds at most 22 ids), checked, gathered, shifted
// and stored as readIDQuadsVBMI does, the lanes still in the block only.
//
// A block is taken whole when its headers are all 0xcd/0xce, out has room
// for its ids, and 84 bytes are left in b from it (so that every quad
// starting in it has the 20 bytes the Go loop asks). The first block that
// is not ends it: its ids before the first other header, as many as out
// has room for (none when the bytes are short), back to the last quad
// boundary (ids from k, in fours), which may lie in the block before. So
// it stops where the Go loop does, unless near the end of b. It writes no
// lane past a block's ids; past the place it returns, at most the three
// ids of the block before that it went back over, which the Go loops go on
// to read.
TEXT ·readIDBlocksVBMI(SB), NOSPLIT, $0-80
	MOVQ out_base+0(FP), DI
	MOVQ out_len+8(FP), R8
	MOVQ b_base+24(FP), SI
	MOVQ b_len+32(FP), R9
	MOVQ k+48(FP), AX
	MOVQ i+56(FP), R12                // the block's first byte
	MOVQ AX, R11                      // k, where quads are counted from
	SUBQ $84, R9                      // the last byte a block may start at

	MOVQ $0x0101010101010101, R10
	VPBROADCASTQ R10, Z31             // byte j: 1
	MOVQ $0xcdcdcdcdcdcdcdcd, R10
	VPBROADCASTQ R10, Z25             // 0xcd
	MOVQ $0x0202020202020202, R10
	VPBROADCASTQ R10, Z24             // 2
	MOVQ $0x4040404040404040, R10
	VPBROADCASTQ R10, Z23             // 64
	VMOVDQU64 idNextIn<>(SB), Z30     // byte j: j+5
	VMOVDQU64 idPast<>(SB), Z29       // byte j: 64+j, a place past the block
	VMOVDQU64 idSpreadLo<>(SB), Z28   // byte 4k+m: k
	VMOVDQU64 idSpreadHi<>(SB), Z27   // byte 4k+m: 16+k
	VMOVDQU64 idAfterHead<>(SB), Z26  // byte 4k+m: 4-m
	VMOVDQU64 idLanesOut<>(SB), Z22   // bytes 32-63: 64, lanes P leaves alone
	MOVL $0xAAAAAAAA, R10
	KMOVD R10, K1                     // lanes k with bit 0 set
	MOVL $0xCCCCCCCC, R10
	KMOVD R10, K2                     // bit 1
	MOVL $0xF0F0F0F0, R10
	KMOVD R10, K3                     // bit 2
	MOVL $0xFF00FF00, R10
	KMOVD R10, K4                     // bit 3
	MOVL $0xFFFF0000, R10
	KMOVD R10, K5                     // bit 4
	VPXORQ Z15, Z15, Z15              // c: the first header's offset, every byte
	XORQ R15, R15                     // ids in the block before

block:
	CMPQ R12, R9
	JGT  late
	VMOVDQU64 (SI)(R12*1), Z0         // the block
	VMOVDQU   64(SI)(R12*1), X1       // and the 16 bytes after it
	// next, and its powers to next³², each a permute of the one before
	// by itself over it and the places past the block (in place, once P
	// has used it); P[k] = next^k(c) in lanes 0-31, lane k taking
	// next^(2^t) where bit t of k is set; lanes 32-63 past the block.
	VPANDQ    Z31, Z0, Z2
	VPADDB    Z2, Z2, Z2
	VPSUBB    Z2, Z30, Z2             // next
	VPORQ     Z22, Z15, Z9
	VPERMI2B  Z29, Z2, K1, Z9
	VPERMT2B  Z29, Z2, Z2             // next²
	VPERMI2B  Z29, Z2, K2, Z9
	VPERMT2B  Z29, Z2, Z2             // next⁴
	VPERMI2B  Z29, Z2, K3, Z9
	VPERMT2B  Z29, Z2, Z2             // next⁸
	VPERMI2B  Z29, Z2, K4, Z9
	VPERMT2B  Z29, Z2, Z2             // next¹⁶
	VPERMI2B  Z29, Z2, K5, Z9
	VPERMT2B  Z29, Z2, Z2             // next³²: the first place past the block
	VPSUBB    Z23, Z2, Z7             // as the next block's offset
	// The ids: four bytes after each header, byte-reversed into its
	// lane, lanes of 0xcd shifted by 16.
	VPERMB    Z0, Z9, Z10             // the headers
	VPERMB    Z9, Z28, Z12
	VPADDB    Z26, Z12, Z12
	VPERMI2B  Z1, Z0, Z12
	VPERMB    Z9, Z27, Z13
	VPADDB    Z26, Z13, Z13
	VPERMI2B  Z1, Z0, Z13
	VPTESTMB  Z31, Z10, K7            // 0xcd
	VPSRLD    $16, Z12, K7, Z12
	KSHIFTRD  $16, K7, K7
	VPSRLD    $16, Z13, K7, Z13
	// The block's headers (P < 64): all 0xcd or 0xce, and room for them.
	VPSUBB    Z25, Z10, Z11
	VPCMPUB   $1, Z24, Z11, K7        // header - 0xcd < 2
	VPCMPUB   $1, Z23, Z9, K6         // P < 64: the block's ids
	KANDNQ    K6, K7, K7
	KORTESTQ  K7, K7
	JNZ       other                   // another encoding among them
	KMOVQ     K6, R13
	POPCNTQ   R13, R13                // how many
	LEAQ      (AX)(R13*1), R14
	CMPQ      R14, R8
	JGT       full                    // more than out has room for
	VPERMB    Z7, Z15, Z15            // the next block's c
	VMOVDQU32 Z12, K6, (DI)(AX*4)     // the block's lanes
	KSHIFTRD  $16, K6, K6
	VMOVDQU32 Z13, K6, 64(DI)(AX*4)
	VMOVDQA64 Z9, Z14                 // P, for a stop in the next block
	MOVQ      R13, R15
	MOVQ      R14, AX
	ADDQ      $64, R12
	JMP       block

late:
	// Fewer than 84 bytes from the block: none of its ids.
	XORQ R10, R10
	VMOVDQA64 Z15, Z9                 // P[0] = c
	JMP  stop

other:
	// The ids before the first other header, as far as out has room.
	KMOVQ  K7, R10
	TZCNTQ R10, R10
	MOVQ   R8, R14
	SUBQ   AX, R14
	CMPQ   R14, R10
	CMOVQLT R14, R10
	JMP    stop

full:
	// As many ids as out has room for.
	MOVQ R8, R10
	SUBQ AX, R10

stop:
	// R10 of the block's ids are good: take them back to the last quad
	// boundary (ids from k, in fours), which is in this block or up to
	// three ids before it, in the block before (which has over three).
	LEAQ  (AX)(R10*1), R13
	MOVQ  R13, R14
	SUBQ  R11, R14
	ANDQ  $3, R14
	SUBQ  R14, R13                    // the boundary's id
	MOVQ  R13, R10
	SUBQ  AX, R10                     // its lane in this block
	JLT   before
	JEQ   here
	// The block's ids up to there, which are good.
	MOVQ  $-1, R14
	BZHIQ R10, R14, R14
	KMOVD R14, K6
	VMOVDQU32 Z12, K6, (DI)(AX*4)
	KSHIFTRD  $16, K6, K6
	VMOVDQU32 Z13, K6, 64(DI)(AX*4)

here:
	MOVQ  R13, AX
	VPBROADCASTB R10, Z8
	VPERMB Z9, Z8, Z8
	VMOVQ X8, R13
	MOVBQZX R13, R13
	ADDQ  R13, R12                    // its header
	JMP   done

before:
	MOVQ  R13, AX
	ADDQ  R10, R15                    // its lane in the block before
	VPBROADCASTB R15, Z8
	VPERMB Z14, Z8, Z8
	VMOVQ X8, R13
	MOVBQZX R13, R13
	LEAQ  -64(R12)(R13*1), R12

done:
	VZEROUPPER
	MOVQ AX, ret+64(FP)
	MOVQ R12, ret1+72(FP)
	RET

DATA idNextIn<>+0(SB)/8, $0x0c0b0a0908070605
DATA idNextIn<>+8(SB)/8, $0x14131211100f0e0d
DATA idNextIn<>+16(SB)/8, $0x1c1b1a1918171615
DATA idNextIn<>+24(SB)/8, $0x24232221201f1e1d
DATA idNextIn<>+32(SB)/8, $0x2c2b2a2928272625
DATA idNextIn<>+40(SB)/8, $0x34333231302f2e2d
DATA idNextIn<>+48(SB)/8, $0x3c3b3a3938373635
DATA idNextIn<>+56(SB)/8, $0x44434241403f3e3d
GLOBL idNextIn<>(SB), RODATA|NOPTR, $64

DATA idPast<>+0(SB)/8, $0x4746454443424140
DATA idPast<>+8(SB)/8, $0x4f4e4d4c4b4a4948
DATA idPast<>+16(SB)/8, $0x5756555453525150
DATA idPast<>+24(SB)/8, $0x5f5e5d5c5b5a5958
DATA idPast<>+32(SB)/8, $0x6766656463626160
DATA idPast<>+40(SB)/8, $0x6f6e6d6c6b6a6968
DATA idPast<>+48(SB)/8, $0x7776757473727170
DATA idPast<>+56(SB)/8, $0x7f7e7d7c7b7a7978
GLOBL idPast<>(SB), RODATA|NOPTR, $64

DATA idSpreadLo<>+0(SB)/8, $0x0101010100000000
DATA idSpreadLo<>+8(SB)/8, $0x0303030302020202
DATA idSpreadLo<>+16(SB)/8, $0x0505050504040404
DATA idSpreadLo<>+24(SB)/8, $0x0707070706060606
DATA idSpreadLo<>+32(SB)/8, $0x0909090908080808
DATA idSpreadLo<>+40(SB)/8, $0x0b0b0b0b0a0a0a0a
DATA idSpreadLo<>+48(SB)/8, $0x0d0d0d0d0c0c0c0c
DATA idSpreadLo<>+56(SB)/8, $0x0f0f0f0f0e0e0e0e
GLOBL idSpreadLo<>(SB), RODATA|NOPTR, $64

DATA idSpreadHi<>+0(SB)/8, $0x1111111110101010
DATA idSpreadHi<>+8(SB)/8, $0x1313131312121212
DATA idSpreadHi<>+16(SB)/8, $0x1515151514141414
DATA idSpreadHi<>+24(SB)/8, $0x1717171716161616
DATA idSpreadHi<>+32(SB)/8, $0x1919191918181818
DATA idSpreadHi<>+40(SB)/8, $0x1b1b1b1b1a1a1a1a
DATA idSpreadHi<>+48(SB)/8, $0x1d1d1d1d1c1c1c1c
DATA idSpreadHi<>+56(SB)/8, $0x1f1f1f1f1e1e1e1e
GLOBL idSpreadHi<>(SB), RODATA|NOPTR, $64

DATA idAfterHead<>+0(SB)/8, $0x0102030401020304
DATA idAfterHead<>+8(SB)/8, $0x0102030401020304
DATA idAfterHead<>+16(SB)/8, $0x0102030401020304
DATA idAfterHead<>+24(SB)/8, $0x0102030401020304
DATA idAfterHead<>+32(SB)/8, $0x0102030401020304
DATA idAfterHead<>+40(SB)/8, $0x0102030401020304
DATA idAfterHead<>+48(SB)/8, $0x0102030401020304
DATA idAfterHead<>+56(SB)/8, $0x0102030401020304
GLOBL idAfterHead<>(SB), RODATA|NOPTR, $64

DATA idLanesOut<>+0(SB)/8, $0
DATA idLanesOut<>+8(SB)/8, $0
DATA idLanesOut<>+16(SB)/8, $0
DATA idLanesOut<>+24(SB)/8, $0
DATA idLanesOut<>+32(SB)/8, $0x4040404040404040
DATA idLanesOut<>+40(SB)/8, $0x4040404040404040
DATA idLanesOut<>+48(SB)/8, $0x4040404040404040
DATA idLanesOut<>+56(SB)/8, $0x4040404040404040
GLOBL idLanesOut<>(SB), RODATA|NOPTR, $64
