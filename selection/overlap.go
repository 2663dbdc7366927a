package selection

// Tiers is a rank's prefix match for one prompt, in blocks, each block
// counted once in its highest tier (docs/selection-api.md, "How a rank is chosen"): Device is the GPU prefix
// depth, Host the host-pinned continuation beyond it, Disk the disk or
// external continuation beyond that.
type Tiers struct {
	Device, Host, Disk uint32
}

// Match is one rank's entry in a Matches result.
type Match struct {
	Rank  Rank
	Tiers Tiers
}

// Matches collects the ranks with a non-zero match. A rank that is absent
// matched nothing. It is reused across calls to avoid allocation.
type Matches struct {
	List []Match
}

// Reset empties m for reuse.
func (m *Matches) Reset() { m.List = m.List[:0] }

// Indexer answers "how much of this prompt does each rank already hold?"
// for a partition. The event-fed KV index implements it; until a partition
// uses events, the approximate index fed by bookings does.
type Indexer interface {
	// FindMatches appends to out the prefix depth, per tier, of every rank
	// of partition p that holds the first block of blocks (local block
	// hashes, in prompt order).
	FindMatches(p PartitionKey, blocks []uint64, out *Matches)
	// RemoveWorker drops everything the index holds for a worker.
	RemoveWorker(p PartitionKey, workerID uint64)
	// Dump returns the partition's content as single-block Stored events,
	// parents before children, so that replaying them rebuilds it.
	Dump(p PartitionKey) []RouterEvent
}

// BookingRecorder is implemented by indexes that learn from bookings (the
// approximate mode): a booked prompt is assumed cached on its rank.
type BookingRecorder interface {
	RecordBooking(p PartitionKey, r Rank, blocks []uint64)
}

// ChainIndexer is implemented by indexes that key blocks by the public
// sequence hashes of the local block hashes (chain[i] stands for blocks
// [0..i]). When the router has computed that chain anyway, it hands it over
// so the index need not hash again.
type ChainIndexer interface {
	FindMatchesChain(p PartitionKey, chain []uint64, out *Matches)
}

// ChainRecorder is BookingRecorder with the chain already computed.
type ChainRecorder interface {
	RecordBookingChain(p PartitionKey, r Rank, blocks, chain []uint64)
}

// RouterEvent is Dynamo's KV event as /dump serializes it
// (docs/selection-api.md, "GET /dump").
type RouterEvent struct {
	WorkerID    uint64  `json:"worker_id"`
	StorageTier string  `json:"storage_tier"`
	Event       KVEvent `json:"event"`
}

// KVEvent is the body of a RouterEvent.
type KVEvent struct {
	EventID uint64     `json:"event_id"`
	Data    StoredData `json:"data"`
	DPRank  uint32     `json:"dp_rank"`
}

// StoredData is the "stored" variant of an event's data, the only one a
// dump contains.
type StoredData struct {
	Stored StoredEvent `json:"stored"`
}

// StoredEvent is a block store: blocks chained under ParentHash.
type StoredEvent struct {
	ParentHash *uint64       `json:"parent_hash"`
	Blocks     []StoredBlock `json:"blocks"`
}

// StoredBlock is one stored block: the engine's hash and our local hash.
type StoredBlock struct {
	BlockHash   uint64 `json:"block_hash"`
	TokensHash  uint64 `json:"tokens_hash"`
	MMExtraInfo any    `json:"mm_extra_info"`
}
