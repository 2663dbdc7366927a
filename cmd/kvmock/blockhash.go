package main

// Block hashes as the simulated engine computes them. They are chained
// like vLLM's (hash_i = H(hash_{i-1}, tokens of block i)), but with
// FNV-1a 64 instead of the gateway's XXH3 scheme on purpose: the gateway
// must treat engine hashes as opaque ids and key its index by the
// token_ids the events carry, exactly as it has to with a real vLLM, whose
// default sha256-over-pickle hashes it cannot reproduce.

// The FNV-1a 64 parameters.
const (
	fnvOffset64 = 14695981039109346037
	fnvPrime64  = 1099511628211
)

// noneHash is the parent of a sequence's first block, vLLM's NONE_HASH.
// It is fixed, so that every worker (and every restart) agrees.
var noneHash = fnvString("kvmock-none-hash")

// rootHash is the parent of the first block of a request served by the
// LoRA adapter lora ("" for the base model). vLLM puts the adapter into
// every block's hash as an extra key; chaining from an adapter's own root
// has the same effect here: no block of one adapter ever has the hash of
// another's, or of the base model's, even for the same tokens. A gateway
// learns the adapter from the events' lora_name, not from these hashes,
// which stay opaque to it.
//
// A cache salt does the same: vLLM hashes it into a request's first block
// only, which changes every block after it.
func rootHash(lora, salt string) uint64 {
	switch {
	case lora == "" && salt == "":
		return noneHash
	case salt == "":
		return fnvString("kvmock-none-hash\x00lora\x00" + lora)
	}
	return fnvString("kvmock-none-hash\x00lora\x00" + lora + "\x00salt\x00" + salt)
}

// fnvString hashes a string with FNV-1a 64.
func fnvString(s string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime64
	}
	return h
}

// blockHash hashes one full block: the parent hash as 8 little-endian
// bytes, then each token as 4 little-endian bytes.
func blockHash(parent uint64, tokens []uint32) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < 8; i++ {
		h = (h ^ (parent >> (8 * i) & 0xff)) * fnvPrime64
	}
	for _, t := range tokens {
		h = (h ^ uint64(t&0xff)) * fnvPrime64
		h = (h ^ uint64(t>>8&0xff)) * fnvPrime64
		h = (h ^ uint64(t>>16&0xff)) * fnvPrime64
		h = (h ^ uint64(t>>24)) * fnvPrime64
	}
	return h
}

// blockHashes returns the chained hashes of the full blocks of tokens, as
// the LoRA adapter lora and the cache salt salt ("" for none) make them; a
// trailing partial block has none, as in vLLM.
func blockHashes(tokens []uint32, blockSize int, lora, salt string) []uint64 {
	n := len(tokens) / blockSize
	out := make([]uint64, n)
	parent := rootHash(lora, salt)
	for i := range n {
		parent = blockHash(parent, tokens[i*blockSize:(i+1)*blockSize])
		out[i] = parent
	}
	return out
}
