package indexer

// The KV events a worker publishes, as the decoder hands them to the
// index: what kind, which blocks, which tier, and whether to skip them.

// Kind is an event's type.
type Kind uint8

// The event kinds.
const (
	Stored Kind = iota + 1
	Removed
	Cleared
)

// Tier is where a block lives, from the event's medium.
type Tier uint8

// The storage tiers, best first.
const (
	Device Tier = iota
	Host
	Disk
	External
)

// tierOf maps a medium to a tier (docs/kv-events.md §5); ok is false for
// a medium we do not know (such events are dropped rather than guessed at).
func tierOf(medium []byte) (Tier, bool) {
	switch string(medium) {
	case "", "GPU", "DEVICE", "gpu", "device":
		return Device, true
	case "CPU", "CPU_PINNED", "CPU_TIER1", "cpu", "cpu_pinned":
		return Host, true
	case "CPU_TIER2", "DISK", "NVME", "STORAGE", "disk":
		return Disk, true
	case "EXTERNAL", "NETWORK", "REMOTE", "SHARED", "external":
		return External, true
	}
	return 0, false
}

// Event is one decoded event. Slices alias the Decoder's buffers and are
// valid until its next Decode.
type Event struct {
	Kind        Kind
	BlockHashes []uint64 // engine hashes, opaque ids
	ParentHash  uint64
	HasParent   bool
	TokenIDs    []uint32
	// Eagle is set when token_ids came as bigram pairs.
	Eagle     bool
	BlockSize int
	Tier      Tier
	LoraName  string
	CacheSalt string
	// Marks, when not nil, has one value per engine block: 0 for a block
	// whose content is its tokens, else a hash of the multimodal or
	// prompt-embeds inputs the engine hashed with them (extrakeys.go).
	Marks []uint64
	// extraKeys is a store's extra_keys as sent, until settleExtraKeys
	// reads it.
	extraKeys []byte
	// Skip is set for events the index must ignore: a group that is not
	// full attention (sliding window, Mamba), an unknown medium, remote
	// locality.
	Skip bool
	// Group is the event's group_idx (a hybrid model's KV-cache group),
	// when HasGroup; FullKind says its kv_cache_spec_kind named full
	// attention. Which group of a rank the index follows: groups.go.
	Group    int64
	HasGroup bool
	FullKind bool
}

// Batch is one decoded message payload.
type Batch struct {
	TS     float64
	Events []Event
	// DPRank is the payload's data-parallel rank, or -1 when absent.
	DPRank int64
}
