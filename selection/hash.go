package selection

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Dynamo's public block hashing, so that our hashes equal those of
// Dynamo-style clients and of the engines' KV events (docs/hashing.md).

// HashSeed is the base XXH3 seed of Dynamo's public block hash scheme
// ("public-xxh3-v1"). Using the same seed makes our block hashes equal to
// the ones Dynamo-style clients send in block_hashes.
const HashSeed uint64 = 1337

// SaltedSeed folds a LoRA adapter name and a cache salt into the base seed,
// as Dynamo's compute_salt_hash does: each non-empty string adds (wrapping)
// its own XXH3 hash, the LoRA name with seed 0 and the salt with seed 1
// (docs/hashing.md, "Seeds").
func SaltedSeed(loraName, cacheSalt string) uint64 {
	seed := HashSeed
	if loraName != "" {
		seed += xxh3.HashStringSeed(loraName, 0)
	}
	return seed + SaltPart(cacheSalt)
}

// SaltPart is what a cache salt adds to the seed (0 for none): the index
// keeps it for a salted chain's blocks, so that a later store continuing
// the chain, which the engine sends without the salt, is salted the same.
func SaltPart(cacheSalt string) uint64 {
	if cacheSalt == "" {
		return 0
	}
	return xxh3.HashStringSeed(cacheSalt, 1)
}

// littleEndian is true on the machines where a []uint32 already is its
// little-endian byte image, so a block can be hashed in place without a copy.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// tokenBytes returns the little-endian bytes of tokens, in place where the
// machine allows it, else encoded into scratch.
func tokenBytes(tokens []uint32, scratch []byte) []byte {
	if len(tokens) == 0 {
		return scratch[:0]
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), len(tokens)*4)
	}
	scratch = scratch[:0]
	for _, t := range tokens {
		scratch = binary.LittleEndian.AppendUint32(scratch, t)
	}
	return scratch
}

// BlockMMInfo is the multimodal content of one block: the hashes of the
// multimodal objects that overlap it. A nil *BlockMMInfo is a text-only block.
type BlockMMInfo struct {
	// MMObjects lists the multimodal objects in the block.
	MMObjects []MMObject `json:"mm_objects"`
}

// MMObject is one multimodal object (an image, say) and where it sits.
type MMObject struct {
	// MMHash identifies the object's content.
	MMHash uint64 `json:"mm_hash"`
	// Offsets are [start, end) token ranges the object occupies.
	Offsets [][2]uint64 `json:"offsets,omitempty"`
}

// HashOptions tunes block hashing for one prompt.
type HashOptions struct {
	// Seed is the salted seed (SaltedSeed); zero means the unsalted HashSeed.
	Seed uint64
	// Eagle hashes each block over block_size+1 tokens (docs/hashing.md,
	// "Eagle windows").
	Eagle bool
	// MM holds per-block multimodal info; entry i applies to block i.
	MM []*BlockMMInfo
}

// BlockCount is the number of complete blocks n tokens make.
func BlockCount(n, blockSize int, eagle bool) int {
	if blockSize <= 0 || n <= 0 {
		return 0
	}
	if eagle {
		return (n - 1) / blockSize
	}
	return n / blockSize
}

// seedWindow returns the seed a prompt's blocks are hashed with (HashSeed
// unless salted) and how many tokens each block's hash covers (one more
// than the block with Eagle windows).
func (o HashOptions) seedWindow(blockSize int) (seed uint64, window int) {
	seed, window = o.Seed, blockSize
	if seed == 0 {
		seed = HashSeed
	}
	if o.Eagle {
		window++
	}
	return seed, window
}

// AppendBlockHashes appends the local block hash of every complete block of
// tokens to dst and returns it. It allocates nothing when dst has room and no
// block carries multimodal data.
func AppendBlockHashes(dst []uint64, tokens []uint32, blockSize int, opt HashOptions) []uint64 {
	seed, window := opt.seedWindow(blockSize)
	n := BlockCount(len(tokens), blockSize, opt.Eagle)
	i := 0
	if kernelBlocks(blockSize, window) && len(opt.MM) == 0 && n >= 8 {
		// Blocks of 64 bytes eight at a time where the processor has
		// AVX-512 (chainedBlocks64, without the chain); the loop below
		// hashes the rest, or all of them elsewhere.
		dst = slices.Grow(dst, n)
		i = chainedBlocks64(tokens, n, seed, dst[len(dst):len(dst)+n], nil)
		dst = dst[:len(dst)+i]
	}
	var scratch []byte
	for ; i < n; i++ {
		blk := tokens[i*blockSize : i*blockSize+window]
		var mm *BlockMMInfo
		if i < len(opt.MM) {
			mm = opt.MM[i]
		}
		if mm == nil || len(mm.MMObjects) == 0 {
			dst = append(dst, xxh3.HashSeed(tokenBytes(blk, scratch[:0]), seed))
			continue
		}
		// Multimodal block: token bytes, then the objects' hashes sorted
		// ascending, each as a little-endian u64.
		scratch = scratch[:0]
		for _, t := range blk {
			scratch = binary.LittleEndian.AppendUint32(scratch, t)
		}
		hashes := make([]uint64, len(mm.MMObjects))
		for j, o := range mm.MMObjects {
			hashes[j] = o.MMHash
		}
		slices.Sort(hashes)
		for _, h := range hashes {
			scratch = binary.LittleEndian.AppendUint64(scratch, h)
		}
		dst = append(dst, xxh3.HashSeed(scratch, seed))
	}
	return dst
}

// kernelBlocks reports whether blocks of blockSize tokens hashed over
// window tokens are the vector kernel's: 16 tokens (64 bytes) apart and
// 16 long. An Eagle window of 16 over 15-token blocks is 16 long but 15
// apart, and the loop hashes it.
func kernelBlocks(blockSize, window int) bool { return blockSize == 16 && window == 16 }

// AppendChainedHashes appends the block hashes of tokens to blocks and
// their sequence hashes to seqs, the same values as AppendBlockHashes then
// AppendSequenceHashes (a test holds them to each other). In one loop the
// processor overlaps the sequence chain, where each step waits on the one
// before it (a 64-bit multiply and an avalanche, about 15 cycles of latency
// and few instructions), with the next blocks' hashes, which depend on
// nothing but their tokens: two loops run the chain's 6,250 steps of a
// 100k-token prompt back to back, waiting on each. Blocks that carry
// multimodal data take the two loops.
func AppendChainedHashes(blocks, seqs []uint64, tokens []uint32, blockSize int, opt HashOptions) ([]uint64, []uint64) {
	if len(opt.MM) > 0 {
		from := len(blocks)
		blocks = AppendBlockHashes(blocks, tokens, blockSize, opt)
		return blocks, AppendSequenceHashes(seqs, blocks[from:])
	}
	seed, window := opt.seedWindow(blockSize)
	n := BlockCount(len(tokens), blockSize, opt.Eagle)
	if n == 0 {
		return blocks, seqs
	}
	blocks, seqs = slices.Grow(blocks, n), slices.Grow(seqs, n)
	bs, ss := blocks[len(blocks):len(blocks)+n], seqs[len(seqs):len(seqs)+n]
	// Blocks of 64 bytes (16 tokens, no Eagle window), eight at a time
	// where the processor has AVX-512 (chainedBlocks64); the loop below
	// hashes the rest, or all of them elsewhere.
	done := 0
	if kernelBlocks(blockSize, window) {
		done = chainedBlocks64(tokens, n, seed, bs, ss)
	}
	var scratch []byte
	var prev uint64
	if done > 0 {
		prev = ss[done-1]
	}
	for i := done; i < n; i++ {
		h := xxh3.HashSeed(tokenBytes(tokens[i*blockSize:i*blockSize+window], scratch[:0]), seed)
		if i == 0 {
			prev = h
		} else {
			prev = NextSequenceHash(prev, h)
		}
		bs[i], ss[i] = h, prev
	}
	return blocks[:len(blocks)+n], seqs[:len(seqs)+n]
}

// NextSequenceHash chains a block hash onto the previous sequence hash:
// XXH3-64 (seed 1337) of the previous hash then the block hash, both as
// little-endian u64 (docs/hashing.md, "Sequence hashes").
//
// It is XXH3's path for inputs of 9 to 16 bytes written out for exactly
// 16: the library's entry point picks that path by length and seed on
// every call, and the index and the lookups chain a key per block.
// TestNextSequenceHashIsXXH3 holds it to the library's answer.
func NextSequenceHash(prev, block uint64) uint64 {
	lo := prev ^ (seqSecretLo + HashSeed)
	hi := block ^ (seqSecretHi - HashSeed)
	mh, ml := bits.Mul64(lo, hi)
	acc := 16 + bits.ReverseBytes64(lo) + hi + (mh ^ ml)
	acc ^= acc >> 37 // XXH3's avalanche
	acc *= 0x165667919e3779f9
	return acc ^ acc>>32
}

// seqSecretLo and seqSecretHi are the XOR of bytes 24–39 and of bytes
// 40–55 of XXH3's default secret, read as little-endian u64 pairs: the
// keys its 9-to-16-byte path mixes into the input's first and last eight
// bytes.
const (
	seqSecretLo = 0x1f67b3b7a4a44072 ^ 0x78e5c0cc4ee679cb
	seqSecretHi = 0x2172ffcc7dd05a82 ^ 0x8e2443f7744608b8
)

// AppendSequenceHashes appends the chained sequence hashes of blocks to dst:
// the first equals the first block hash, each next one chains the previous.
func AppendSequenceHashes(dst []uint64, blocks []uint64) []uint64 {
	for i, h := range blocks {
		if i == 0 {
			dst = append(dst, h)
			continue
		}
		dst = append(dst, NextSequenceHash(dst[len(dst)-1], h))
	}
	return dst
}
