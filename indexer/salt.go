package indexer

import "github.com/kvrouter/caddy-kvrouter/selection"

// Salted chains. A request's cache_salt seeds every one of its blocks'
// local hashes (as the selection API's hashing does, docs/hashing.md),
// but vLLM names the salt only in the first block's extra_keys: the
// stores that continue a salted chain (the next chunk of a long prefill,
// blocks completed while decoding, a later request that shares part of
// the chain) come without it. The tree therefore remembers, for each
// block of a salted chain, its salt's part of the seed (tree.salts, by
// chain key), and a store whose parent is salted is hashed with it.
// Only salted blocks are kept there, and each leaves with its record, so
// unsalted traffic pays one length check per freed record.

// localHashes appends the local hashes of ev's blocks, salted by salt
// (SaltPart) and by the LoRA name, then mixes each marked engine block's
// mark (extrakeys.go) into the first of our blocks it covers.
func (t *tree) localHashes(dst []uint64, ev *Event, ebs int, salt uint64) []uint64 {
	opt := selection.HashOptions{Seed: selection.SaltedSeed(ev.LoraName, "") + salt, Eagle: ev.Eagle || t.eagle}
	locals := selection.AppendBlockHashes(dst, ev.TokenIDs, t.blockSize, opt)
	for i, mark := range ev.Marks {
		if mark == 0 {
			continue
		}
		j := i * ebs / t.blockSize
		if j >= len(locals) {
			break
		}
		locals[j] = selection.NextSequenceHash(locals[j], mark)
	}
	return locals
}

// inheritSalt hashes h's blocks again with the salt of the parent block
// (chain key parentKey) when the event names none and the parent is
// salted; otherwise h is returned as it is. The write lock is held.
func (t *tree) inheritSalt(ev *Event, h hashed, parentKey uint64) hashed {
	if h.salt != 0 || !h.ok || len(t.salts) == 0 {
		return h
	}
	salt, ok := t.salts[parentKey]
	if !ok {
		return h
	}
	h.salt = salt
	h.locals = t.localHashes(h.locals[:0], ev, h.ebs, salt)
	return h
}

// noteSalted remembers the salt of a salted store's blocks (chain keys).
func (t *tree) noteSalted(keys []uint64, salt uint64) {
	if salt == 0 {
		return
	}
	if t.salts == nil {
		t.salts = make(map[uint64]uint64, len(keys))
	}
	for _, k := range keys {
		t.salts[k] = salt
	}
}

// forgetSalt drops a freed block's salt.
func (t *tree) forgetSalt(key uint64) {
	if len(t.salts) != 0 {
		delete(t.salts, key)
	}
}
