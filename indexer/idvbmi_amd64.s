#include "textflag.h"

// func readIDQuadsVBMI(out []uint32, b []byte, k, i int) (int, int)
//
// readIDQuads (fields.go) sixteen ids at a time in AVX-512 VBMI: it
// takes, from id k at byte i, exactly the quads readIDQuads would take and
// returns where readIDQuads would stop. Per step, an 80-byte window at i
// (sixteen ids of at most five bytes):
//
//   - each byte j's would-be successor: next[j] = j + 5 - 2·(b[j]&1), the
//     next header's place were j a 0xcd (odd, 3 bytes) or 0xce (even, 5)
//     header; composed with itself by byte permutes (next², next⁴, next⁸,
//     and next¹⁶ for the step's length), so that the places of the sixteen
//     headers from the first, P[k] = next^k(0), take four masked permutes,
//     lane k applying next^(2^t) where bit t of k is set;
//   - the headers at P are checked for 0xcd/0xce; each id's four bytes
//     after its header are gathered big-endian into a 32-bit lane, and the
//     lanes of 0xcd ids shifted right by 16, as the Go loop does;
//   - a quad is taken while its headers pass, four ids are left in out,
//     and 20 bytes are left in b from its first header (readIDQuads' loop
//     condition); the ids of the quads taken are stored, no lane past them.
//
// Near the end of b the window is read by masked loads, which neither
// fault nor read past len(b): bytes past it read as zero, and no quad
// taken reaches them. The chain from one step to the next is the load,
// next and its four compositions: the checks hang off it, and a branch
// predicted taken (all sixteen ids good) lets the next step start before
// they are done.
TEXT ·readIDQuadsVBMI(SB), NOSPLIT, $0-80
	MOVQ out_base+0(FP), DI
	MOVQ out_len+8(FP), R8
	MOVQ b_base+24(FP), SI
	MOVQ b_len+32(FP), R9
	MOVQ k+48(FP), AX
	MOVQ i+56(FP), BX

	MOVQ $0x0101010101010101, R10
	VPBROADCASTQ R10, Z31             // byte j: 1
	MOVQ $0xcdcdcdcdcdcdcdcd, R10
	VPBROADCASTQ R10, Z26             // byte j: 0xcd
	MOVQ $0x0202020202020202, R10
	VPBROADCASTQ R10, Z25             // byte j: 2
	VMOVDQU64 idNextLo<>(SB), Z30     // byte j: j+5
	VMOVDQU64 idNextHi<>(SB), Z29     // byte j: 64+j+5
	VMOVDQU64 idSpread<>(SB), Z28     // byte 4k+m: k
	VMOVDQU64 idByteOf<>(SB), Z27     // byte 4k+m: 4-m, its place after the header
	MOVL $0xAAAA, R10
	KMOVW R10, K1                     // lanes k with bit 0 set
	MOVL $0xCCCC, R10
	KMOVW R10, K2                     // bit 1
	MOVL $0xF0F0, R10
	KMOVW R10, K3                     // bit 2
	MOVL $0xFF00, R10
	KMOVW R10, K4                     // bit 3

step:
	MOVQ R8, R10
	SUBQ AX, R10                      // ids left in out
	CMPQ R10, $4
	JLT  done
	MOVQ R9, R11
	SUBQ BX, R11                      // bytes left in b
	CMPQ R11, $20
	JLT  done
	LEAQ (SI)(BX*1), R12
	CMPQ R11, $80
	JLT  tail
	VMOVDQU64 (R12), Z0               // window bytes 0-63
	VMOVDQU   64(R12), X1             // 64-79; the rest of Z1 zero
	JMP  loaded

tail:
	// Fewer than 80 bytes left: load what there is, zeros after it.
	MOVQ $-1, R13
	BZHIQ R11, R13, R14               // bytes 0-63 of the window (all, from 64 on)
	KMOVQ R14, K5
	VMOVDQU8.Z (R12), K5, Z0
	MOVQ R11, R14
	SUBQ $64, R14                     // bytes past 64, if any
	XORQ R15, R15
	CMPQ R14, $0
	CMOVQLT R15, R14
	BZHIQ R14, R13, R14
	KMOVQ R14, K5
	VMOVDQU8.Z 64(R12), K5, Z1

loaded:
	// next, for window bytes 0-63 (Z2) and 64-127 (Z3, good to 79).
	VPANDQ   Z31, Z0, Z2
	VPADDB   Z2, Z2, Z2
	VPSUBB   Z2, Z30, Z2
	VPANDQ   Z31, Z1, Z3
	VPADDB   Z3, Z3, Z3
	VPSUBB   Z3, Z29, Z3
	// next² over both halves (the low good to 70, the high to 79 - 5),
	// next⁴ over the low half (good to 60), next⁸ (to 40) and next¹⁶ at 0,
	// each a permute of the one before by itself.
	VMOVDQA64 Z2, Z4
	VPERMI2B  Z3, Z2, Z4              // next², bytes 0-63
	VMOVDQA64 Z3, Z5
	VPERMI2B  Z3, Z2, Z5              // next², bytes 64-79
	VMOVDQA64 Z4, Z6
	VPERMI2B  Z5, Z4, Z6              // next⁴
	VPERMB    Z6, Z6, Z7              // next⁸
	VPERMB    Z7, Z7, Z8              // next¹⁶: byte 0 is the step's length
	// P[k] = next^k(0), lanes 0-15 (the rest 0): every place looked up is
	// one P reaches, where the tables above are good.
	VPXORQ    Z9, Z9, Z9
	VPERMB    Z2, Z9, K1, Z9
	VPERMB    Z4, Z9, K2, Z9
	VPERMB    Z6, Z9, K3, Z9
	VPERMB    Z7, Z9, K4, Z9
	// The headers at P: 0xcd or 0xce, and which are 0xcd (odd).
	VMOVDQA64 Z9, Z10
	VPERMI2B  Z1, Z0, Z10
	VPSUBB    Z26, Z10, Z11
	VPCMPUB   $1, Z25, Z11, K5        // header - 0xcd < 2
	VPTESTMB  Z31, Z10, K6            // 0xcd
	// Quads whose first header leaves 20 bytes in b: P <= left-20, at
	// most 255.
	MOVQ R11, R14
	SUBQ $20, R14
	MOVQ $255, R15
	CMPQ R14, R15
	CMOVQGT R15, R14
	VPBROADCASTB R14, Z13
	VPCMPUB   $2, Z13, Z9, K7         // P <= left-20
	// Each id's four bytes after its header, byte-reversed into its lane:
	// lane k's byte m is window[P[k]+4-m]; 0xcd lanes shifted by 16.
	VPERMB    Z9, Z28, Z12
	VPADDB    Z27, Z12, Z12
	VPERMI2B  Z1, Z0, Z12
	VPSRLD    $16, Z12, K6, Z12

	// How many ids to take: whole quads before the first bad header,
	// before the first quad that starts too late, and that out has room
	// for.
	KMOVQ K5, R13
	NOTQ  R13
	ORQ   $0x10000, R13
	TZCNTQ R13, R13
	ANDQ  $-4, R13                    // quads before the first bad header
	KMOVQ K7, R14
	NOTQ  R14
	ORQ   $0x10000, R14
	TZCNTQ R14, R14
	ADDQ  $3, R14
	ANDQ  $-4, R14                    // quads that start in time
	CMPQ  R14, R13
	CMOVQLT R14, R13
	ANDQ  $-4, R10                    // quads out has room for
	CMPQ  R10, R13
	CMOVQLT R10, R13
	CMPQ  R13, $16
	JNE   partial

	VMOVDQU32 Z12, (DI)(AX*4)
	VMOVQ     X8, R14
	MOVBQZX   R14, R14
	ADDQ  $16, AX
	ADDQ  R14, BX
	JMP   step

partial:
	// Fewer than sixteen: store those, advance by their lengths, 3 bytes
	// each and 2 more for each 0xce, and stop, as the Go loop would at
	// the next quad.
	TESTQ R13, R13
	JZ    done
	MOVQ  $-1, R14
	BZHIQ R13, R14, R14               // the lanes taken
	KMOVW R14, K7
	VMOVDQU32 Z12, K7, (DI)(AX*4)
	KMOVQ K6, R15
	ANDNQ R14, R15, R15               // 0xce lanes among them
	POPCNTQ R15, R15
	LEAQ  (R13)(R13*2), R14
	LEAQ  (R14)(R15*2), R14
	ADDQ  R13, AX
	ADDQ  R14, BX

done:
	VZEROUPPER
	MOVQ AX, ret+64(FP)
	MOVQ BX, ret1+72(FP)
	RET

DATA idNextLo<>+0(SB)/8, $0x0c0b0a0908070605
DATA idNextLo<>+8(SB)/8, $0x14131211100f0e0d
DATA idNextLo<>+16(SB)/8, $0x1c1b1a1918171615
DATA idNextLo<>+24(SB)/8, $0x24232221201f1e1d
DATA idNextLo<>+32(SB)/8, $0x2c2b2a2928272625
DATA idNextLo<>+40(SB)/8, $0x34333231302f2e2d
DATA idNextLo<>+48(SB)/8, $0x3c3b3a3938373635
DATA idNextLo<>+56(SB)/8, $0x44434241403f3e3d
GLOBL idNextLo<>(SB), RODATA|NOPTR, $64

DATA idNextHi<>+0(SB)/8, $0x4c4b4a4948474645
DATA idNextHi<>+8(SB)/8, $0x54535251504f4e4d
DATA idNextHi<>+16(SB)/8, $0x5c5b5a5958575655
DATA idNextHi<>+24(SB)/8, $0x64636261605f5e5d
DATA idNextHi<>+32(SB)/8, $0x6c6b6a6968676665
DATA idNextHi<>+40(SB)/8, $0x74737271706f6e6d
DATA idNextHi<>+48(SB)/8, $0x7c7b7a7978777675
DATA idNextHi<>+56(SB)/8, $0x84838281807f7e7d
GLOBL idNextHi<>(SB), RODATA|NOPTR, $64

DATA idSpread<>+0(SB)/8, $0x0101010100000000
DATA idSpread<>+8(SB)/8, $0x0303030302020202
DATA idSpread<>+16(SB)/8, $0x0505050504040404
DATA idSpread<>+24(SB)/8, $0x0707070706060606
DATA idSpread<>+32(SB)/8, $0x0909090908080808
DATA idSpread<>+40(SB)/8, $0x0b0b0b0b0a0a0a0a
DATA idSpread<>+48(SB)/8, $0x0d0d0d0d0c0c0c0c
DATA idSpread<>+56(SB)/8, $0x0f0f0f0f0e0e0e0e
GLOBL idSpread<>(SB), RODATA|NOPTR, $64

DATA idByteOf<>+0(SB)/8, $0x0102030401020304
DATA idByteOf<>+8(SB)/8, $0x0102030401020304
DATA idByteOf<>+16(SB)/8, $0x0102030401020304
DATA idByteOf<>+24(SB)/8, $0x0102030401020304
DATA idByteOf<>+32(SB)/8, $0x0102030401020304
DATA idByteOf<>+40(SB)/8, $0x0102030401020304
DATA idByteOf<>+48(SB)/8, $0x0102030401020304
DATA idByteOf<>+56(SB)/8, $0x0102030401020304
GLOBL idByteOf<>(SB), RODATA|NOPTR, $64
