#include "textflag.h"

// MULFOLD sets out to the high 64 bits XOR the low 64 bits of the 128-bit
// product of each lane of x and y (xxh3's mulFold64), eight lanes at
// once: AVX-512 multiplies 64 by 64 bits only to the low half
// (VPMULLQ), so the high half is put together from the four 32-by-32-bit
// products (VPMULUDQ) and their carries. x and y are kept; Z8-Z16 are
// clobbered. Z23 holds 0xFFFFFFFF in every lane.
#define MULFOLD(x, y, out) \
	VPSRLQ   $32, x, Z8; \
	VPSRLQ   $32, y, Z9; \
	VPMULUDQ y, x, Z10; \
	VPMULUDQ Z9, x, Z11; \
	VPMULUDQ y, Z8, Z12; \
	VPMULUDQ Z9, Z8, Z13; \
	VPMULLQ  y, x, Z14; \
	VPSRLQ   $32, Z10, Z10; \
	VPANDQ   Z23, Z11, Z15; \
	VPANDQ   Z23, Z12, Z16; \
	VPADDQ   Z15, Z10, Z10; \
	VPADDQ   Z16, Z10, Z10; \
	VPSRLQ   $32, Z11, Z11; \
	VPSRLQ   $32, Z12, Z12; \
	VPSRLQ   $32, Z10, Z10; \
	VPADDQ   Z11, Z13, Z13; \
	VPADDQ   Z12, Z13, Z13; \
	VPADDQ   Z10, Z13, Z13; \
	VPXORQ   Z14, Z13, out

// func chainedHashes64AVX512(tokens *uint32, groups int, seed uint64, blocks *uint64, seqs *uint64, prev uint64, first bool)
//
// The xxh3-64 hash (with seed) of each of 8*groups blocks of 64 bytes
// from tokens, to blocks, and their sequence hashes, to seqs: each
// NextSequenceHash of the one before (prev for the first block) and the
// block's, or, when first is set, the first block's own hash. A nil seqs
// asks for the block hashes alone: the chain is skipped.
// It is xxh3's path for inputs of 33 to 128 bytes, for exactly 64: the
// length times prime64_1, plus mulFold64 of each of the four 16-byte
// pairs XORed with the default secret's keys (plus and minus the seed),
// then the avalanche; eight blocks at once, one per lane. The chain runs on the scalar
// units, eight steps a group, while the vector units hash the next group.
TEXT ·chainedHashes64AVX512(SB), NOSPLIT, $0-49
	MOVQ tokens+0(FP), SI
	MOVQ groups+8(FP), CX
	MOVQ seed+16(FP), R8
	MOVQ blocks+24(FP), DI
	MOVQ seqs+32(FP), R9
	TESTQ CX, CX
	JLE  ret

	// The keys: u64s of the default secret, plus the seed for the first
	// word of a pair and minus it for the second. xxh3 pairs the words
	// from both ends of the input: words 0-1 with the secret's bytes
	// 0-15, words 6-7 (the last 16 bytes) with 16-31, words 2-3 with
	// 32-47, words 4-5 (the last 32) with 48-63.
	MOVQ $0xbe4ba423396cfeb8, AX // word 0: key 0
	ADDQ R8, AX
	VPBROADCASTQ AX, Z24
	MOVQ $0x1cad21f72c81017c, AX // word 1: key 8
	SUBQ R8, AX
	VPBROADCASTQ AX, Z25
	MOVQ $0x78e5c0cc4ee679cb, AX // word 2: key 32
	ADDQ R8, AX
	VPBROADCASTQ AX, Z26
	MOVQ $0x2172ffcc7dd05a82, AX // word 3: key 40
	SUBQ R8, AX
	VPBROADCASTQ AX, Z27
	MOVQ $0x8e2443f7744608b8, AX // word 4: key 48
	ADDQ R8, AX
	VPBROADCASTQ AX, Z28
	MOVQ $0x4c263a81e69035e0, AX // word 5: key 56
	SUBQ R8, AX
	VPBROADCASTQ AX, Z29
	MOVQ $0xdb979083e96dd4de, AX // word 6: key 16
	ADDQ R8, AX
	VPBROADCASTQ AX, Z30
	MOVQ $0x1f67b3b7a4a44072, AX // word 7: key 24
	SUBQ R8, AX
	VPBROADCASTQ AX, Z31
	MOVQ $0x00000000FFFFFFFF, AX
	VPBROADCASTQ AX, Z23
	MOVQ $0x8dde6c617af2a1c0, AX // 64 * prime64_1
	VPBROADCASTQ AX, Z21
	MOVQ $0x165667919e3779f9, AX // the avalanche's multiplier
	VPBROADCASTQ AX, Z20

	// The chain's constants (NextSequenceHash): seqSecretLo + 1337,
	// seqSecretHi - 1337, the avalanche's multiplier.
	MOVQ $0x6782737bea423ef2, R10
	MOVQ $0xaf56bc3b09964d01, R11
	MOVQ $0x165667919e3779f9, R12
	MOVQ   prev+40(FP), R13
	MOVBQZX first+48(FP), R15 // set: the first block starts the chain

group:
	// Eight blocks, one to a register, then transposed (8x8 words, three
	// rounds of shuffles) so that register 8+k holds word k of all eight:
	// eight loads and 24 shuffles cost less than eight gathers.
	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVDQU64 256(SI), Z4
	VMOVDQU64 320(SI), Z5
	VMOVDQU64 384(SI), Z6
	VMOVDQU64 448(SI), Z7
	// Pairs of blocks: even words (0, 2, 4, 6) and odd ones, interleaved.
	VPUNPCKLQDQ Z1, Z0, Z8
	VPUNPCKHQDQ Z1, Z0, Z9
	VPUNPCKLQDQ Z3, Z2, Z10
	VPUNPCKHQDQ Z3, Z2, Z11
	VPUNPCKLQDQ Z5, Z4, Z12
	VPUNPCKHQDQ Z5, Z4, Z13
	VPUNPCKLQDQ Z7, Z6, Z14
	VPUNPCKHQDQ Z7, Z6, Z15
	// Fours of blocks: 128-bit lanes 0 and 2 (0x88) or 1 and 3 (0xDD)
	// of each pair.
	VSHUFI64X2 $0x88, Z10, Z8, Z0 // words 0, 4 of blocks 0-3
	VSHUFI64X2 $0xDD, Z10, Z8, Z1 // words 2, 6
	VSHUFI64X2 $0x88, Z11, Z9, Z2 // words 1, 5
	VSHUFI64X2 $0xDD, Z11, Z9, Z3 // words 3, 7
	VSHUFI64X2 $0x88, Z14, Z12, Z4 // the same of blocks 4-7
	VSHUFI64X2 $0xDD, Z14, Z12, Z5
	VSHUFI64X2 $0x88, Z15, Z13, Z6
	VSHUFI64X2 $0xDD, Z15, Z13, Z7
	// All eight: word k to register 8+k.
	VSHUFI64X2 $0x88, Z4, Z0, Z8
	VSHUFI64X2 $0xDD, Z4, Z0, Z12
	VSHUFI64X2 $0x88, Z5, Z1, Z10
	VSHUFI64X2 $0xDD, Z5, Z1, Z14
	VSHUFI64X2 $0x88, Z6, Z2, Z9
	VSHUFI64X2 $0xDD, Z6, Z2, Z13
	VSHUFI64X2 $0x88, Z7, Z3, Z11
	VSHUFI64X2 $0xDD, Z7, Z3, Z15
	VPXORQ Z24, Z8, Z0
	VPXORQ Z25, Z9, Z1
	VPXORQ Z26, Z10, Z2
	VPXORQ Z27, Z11, Z3
	VPXORQ Z28, Z12, Z4
	VPXORQ Z29, Z13, Z5
	VPXORQ Z30, Z14, Z6
	VPXORQ Z31, Z15, Z7
	MULFOLD(Z0, Z1, Z17)
	MULFOLD(Z2, Z3, Z18)
	MULFOLD(Z4, Z5, Z19)
	MULFOLD(Z6, Z7, Z0)
	VPADDQ Z21, Z17, Z17
	VPADDQ Z18, Z17, Z17
	VPADDQ Z19, Z17, Z17
	VPADDQ Z0, Z17, Z17
	VPSRLQ $37, Z17, Z1 // the avalanche
	VPXORQ Z1, Z17, Z17
	VPMULLQ Z20, Z17, Z17
	VPSRLQ $32, Z17, Z1
	VPXORQ Z1, Z17, Z17
	VMOVDQU64 Z17, (DI)

	TESTQ R9, R9
	JZ   next // block hashes alone
	XORQ BX, BX
	TESTQ R15, R15
	JZ   chain
	MOVQ (DI), R13 // the first block's hash is its sequence hash
	MOVQ R13, (R9)
	MOVQ $1, BX
	XORQ R15, R15

chain:
	MOVQ  (DI)(BX*8), AX
	XORQ  R11, AX // hi
	MOVQ  AX, R8
	MOVQ  R13, R14
	XORQ  R10, R14 // lo
	MULQ  R14      // DX:AX = lo * hi
	XORQ  DX, AX
	BSWAPQ R14
	ADDQ  R14, AX
	ADDQ  R8, AX
	ADDQ  $16, AX
	MOVQ  AX, DX
	SHRQ  $37, DX
	XORQ  DX, AX
	IMULQ R12, AX
	MOVQ  AX, DX
	SHRQ  $32, DX
	XORQ  DX, AX
	MOVQ  AX, R13
	MOVQ  AX, (R9)(BX*8)
	INCQ  BX
	CMPQ  BX, $8
	JLT   chain
	ADDQ $64, R9

next:
	ADDQ $512, SI
	ADDQ $64, DI
	DECQ CX
	JNZ  group
	VZEROUPPER

ret:
	RET
