package indexer

import (
	"encoding/binary"
	"math"
)

// An encoder for KV-event payloads in vLLM's wire format, for publishers
// that speak it (the simulated workers, tests). It writes the compact
// msgpack forms msgspec writes (docs/kv-events.md §4).

// Encoding selects the event encoding of a payload.
type Encoding uint8

// The two event encodings vLLM has used.
const (
	// EncodingMap is vLLM's current form: each event a map tagged by "type".
	EncodingMap Encoding = iota
	// EncodingArray is the positional form of vLLM before mid-2026.
	EncodingArray
)

// StoredBlocks describes a BlockStored event to encode.
type StoredBlocks struct {
	BlockHashes []uint64
	Parent      *uint64
	TokenIDs    []uint32
	BlockSize   int
	Medium      string // "" encodes nil (GPU)
	LoraName    string
	// CacheSalt is the request's salt, which vLLM names only in the first
	// block's extra_keys, and only in the store that starts a chain
	// (Parent nil); a store continuing the chain does not carry it.
	CacheSalt string
	// MM has, for each engine block, the identifier of a multimodal item
	// the block overlaps ("" for none), written as vLLM's
	// [identifier, offset] pair; nil for a text prompt.
	MM []string
	// Group is the store's group_idx; SpecKind, when set, its
	// kv_cache_spec_kind (a hybrid model's groups name their kinds).
	Group    int
	SpecKind string
}

// AppendBatch appends a payload [ts, events, dp_rank] to dst. Each event is
// a *StoredBlocks, a Removal or Clear{}.
func AppendBatch(dst []byte, enc Encoding, ts float64, dpRank int, events ...any) []byte {
	dst = appendArrayHeader(dst, 3)
	dst = append(dst, 0xcb)
	dst = binary.BigEndian.AppendUint64(dst, math.Float64bits(ts))
	dst = appendArrayHeader(dst, len(events))
	for _, ev := range events {
		switch e := ev.(type) {
		case *StoredBlocks:
			dst = appendStored(dst, enc, e)
		case Removal:
			dst = appendRemoved(dst, enc, e)
		case Clear:
			if enc == EncodingMap {
				dst = appendMapHeader(dst, 1)
				dst = appendStr(appendStr(dst, "type"), "AllBlocksCleared")
			} else {
				dst = appendStr(appendArrayHeader(dst, 1), "AllBlocksCleared")
			}
		}
	}
	if dpRank < 0 {
		return append(dst, 0xc0)
	}
	return appendInt(dst, int64(dpRank))
}

// Removal describes a BlockRemoved event.
type Removal struct {
	BlockHashes []uint64
	Medium      string
	// Group, when Grouped, is written as the removal's group_idx.
	Group   int
	Grouped bool
}

// Clear is an AllBlocksCleared event.
type Clear struct{}

func appendStored(dst []byte, enc Encoding, e *StoredBlocks) []byte {
	field := func(dst []byte, name string) []byte {
		if enc == EncodingMap {
			return appendStr(dst, name)
		}
		return dst
	}
	fields := 10
	if e.SpecKind != "" {
		fields++
	}
	if enc == EncodingMap {
		dst = appendMapHeader(dst, fields)
		dst = appendStr(appendStr(dst, "type"), "BlockStored")
	} else {
		dst = appendStr(appendArrayHeader(dst, fields), "BlockStored")
	}
	dst = appendHashes(field(dst, "block_hashes"), e.BlockHashes)
	dst = field(dst, "parent_block_hash")
	if e.Parent == nil {
		dst = append(dst, 0xc0)
	} else {
		dst = appendUint(dst, *e.Parent)
	}
	dst = appendArrayHeader(field(dst, "token_ids"), len(e.TokenIDs))
	for _, t := range e.TokenIDs {
		dst = appendUint(dst, uint64(t))
	}
	dst = appendInt(field(dst, "block_size"), int64(e.BlockSize))
	dst = append(field(dst, "lora_id"), 0xc0)
	dst = appendOptStr(field(dst, "medium"), e.Medium)
	dst = appendOptStr(field(dst, "lora_name"), e.LoraName)
	dst = appendExtraKeys(field(dst, "extra_keys"), e)
	dst = appendInt(field(dst, "group_idx"), int64(e.Group))
	if e.SpecKind != "" {
		dst = appendOptStr(field(dst, "kv_cache_spec_kind"), e.SpecKind)
	}
	return dst
}

// appendExtraKeys writes a store's extra_keys as vLLM fills them: per
// block nil, or the LoRA name, the block's multimodal pair, and the salt
// in the first block of a store with no parent; nil when no block has any.
func appendExtraKeys(dst []byte, e *StoredBlocks) []byte {
	keysOf := func(i int) (lora, mm, salt bool) {
		lora = e.LoraName != ""
		mm = i < len(e.MM) && e.MM[i] != ""
		salt = i == 0 && e.Parent == nil && e.CacheSalt != ""
		return
	}
	some := false
	for i := range e.BlockHashes {
		lora, mm, salt := keysOf(i)
		some = some || lora || mm || salt
	}
	if !some {
		return append(dst, 0xc0)
	}
	dst = appendArrayHeader(dst, len(e.BlockHashes))
	for i := range e.BlockHashes {
		lora, mm, salt := keysOf(i)
		n := btoi(lora) + btoi(mm) + btoi(salt)
		if n == 0 {
			dst = append(dst, 0xc0)
			continue
		}
		dst = appendArrayHeader(dst, n)
		if lora {
			dst = appendStr(dst, e.LoraName)
		}
		if mm {
			dst = appendInt(appendStr(appendArrayHeader(dst, 2), e.MM[i]), 0)
		}
		if salt {
			dst = appendStr(dst, e.CacheSalt)
		}
	}
	return dst
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func appendRemoved(dst []byte, enc Encoding, e Removal) []byte {
	fields := 3
	if e.Grouped {
		fields++
	}
	if enc == EncodingMap {
		dst = appendMapHeader(dst, fields)
		dst = appendStr(appendStr(dst, "type"), "BlockRemoved")
		dst = appendHashes(appendStr(dst, "block_hashes"), e.BlockHashes)
		dst = appendOptStr(appendStr(dst, "medium"), e.Medium)
		if e.Grouped {
			dst = appendInt(appendStr(dst, "group_idx"), int64(e.Group))
		}
		return dst
	}
	dst = appendStr(appendArrayHeader(dst, fields), "BlockRemoved")
	dst = appendOptStr(appendHashes(dst, e.BlockHashes), e.Medium)
	if e.Grouped {
		dst = appendInt(dst, int64(e.Group))
	}
	return dst
}

func appendHashes(dst []byte, hs []uint64) []byte {
	dst = appendArrayHeader(dst, len(hs))
	for _, h := range hs {
		dst = appendUint(dst, h)
	}
	return dst
}

func appendArrayHeader(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(dst, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
}

func appendMapHeader(dst []byte, n int) []byte {
	if n < 16 {
		return append(dst, 0x80|byte(n))
	}
	return binary.BigEndian.AppendUint16(append(dst, 0xde), uint16(n))
}

func appendStr(dst []byte, s string) []byte {
	switch {
	case len(s) < 32:
		dst = append(dst, 0xa0|byte(len(s)))
	case len(s) < 256:
		dst = append(dst, 0xd9, byte(len(s)))
	default:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xda), uint16(len(s)))
	}
	return append(dst, s...)
}

func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, 0xc0)
	}
	return appendStr(dst, s)
}

func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v < 128:
		return append(dst, byte(v))
	case v < 256:
		return append(dst, 0xcc, byte(v))
	case v < 1<<16:
		return binary.BigEndian.AppendUint16(append(dst, 0xcd), uint16(v))
	case v < 1<<32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xcf), v)
}

func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return appendUint(dst, uint64(v))
	}
	if v >= -32 {
		return append(dst, byte(int8(v)))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
}
