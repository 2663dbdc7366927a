package indexer

import (
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Index is the precise prefix index fed by KV events (docs/kv-events.md
// says what the events carry). Blocks are keyed by our own chain key: the
// public sequence hash of the local block hashes we compute from the
// tokens each BlockStored carries, so a prompt's sequence hashes look them
// up directly. Each (worker, dp_rank) keeps a table from the engine's
// opaque block hash to our block, reference-counted because an engine can
// store the same hash twice.
//
// It implements selection.Indexer. Events of one rank must be applied in
// order (one listener goroutine per rank does); lookups run concurrently.
//
// Memory: a block is one 40-byte record (record.go) in pages addressed
// by 32-bit indexes (slab.go), which carries its first holder and that
// holder's engine entry inline; the node table and the rank's engine
// table each hold a 4-byte ref to it and a 1-byte tag (reftable.go:
// twelve to a cache line, at most 7/8 full), and with a bound the
// eviction queue a 4-byte ref: about 62
// bytes for a block held by one rank. Each further rank holding it adds
// a 24-byte holder, a 4-byte ref in the block's holder set, a table slot
// and a queue ref. BytesPerEntry is the measured figure
// (BenchmarkIndexMemory) and EntriesForMemory turns a budget into
// MaxEntries.
//
// MaxEntries caps the (block, rank) entries: a store that finds the index
// full is still indexed, and entries are evicted to make room: the oldest
// (by store time, over all partitions) of the ranks holding more than
// their share of the bound (evict.go). Engines evict and report blocks
// as their caches fill, so the cap is a safety net against a misbehaving
// publisher or a fleet larger than the budget, not the normal way out;
// when it is reached, new blocks (the ones the next turn of a session
// asks for) win over old ones.
type Index struct {
	// parts maps partitions to their trees. It is replaced whole, under
	// mu, when a partition is configured, and read without a lock: every
	// event and every lookup finds its tree here, and a read lock's two
	// atomic adds cost an event more than the map lookup itself.
	mu    sync.Mutex
	parts atomic.Pointer[map[selection.PartitionKey]*tree]

	// MaxEntries bounds the (block, rank) entries over all partitions; 0
	// means no bound. Set it before use: the eviction queue only records
	// entries stored while a bound is set.
	MaxEntries int64
	// IngestCores is how many listeners may decode and apply payloads at
	// once (ingestgate.go); 0 means every core but one (GOMAXPROCS-1, at
	// least 1). Set it before the first listener starts.
	IngestCores int
	ingest      ingestGate
	loops       ingestLoops // the goroutines that receive for listeners (ingestloop.go)
	// turnHold is how long a listener keeps an ingest turn while payloads
	// keep coming: turnSlice, or what a test sets before use.
	turnHold time.Duration
	entries  atomic.Int64
	// rankTables counts the ranks with an engine table, over all
	// partitions: the bound's share of each is MaxEntries over it
	// (evict.go). victim is the rank eviction last found over its share.
	rankTables atomic.Int64
	victim     atomic.Pointer[victim]
	// stamps numbers stored entries, for eviction order and to tell a
	// queued entry from a later one under the same engine hash.
	stamps atomic.Uint32
	// released counts entries dropped in bulk (cleared ranks, removed
	// workers) since memory was last handed back to the OS.
	released atomic.Int64

	// counters are reported through Counts (stats.go).
	counters indexCounters

	// lookupHold is how long a lookup holds a partition's read lock before
	// it lets waiting events in: lookupHoldDefault, or what a test sets
	// before use.
	lookupHold time.Duration
	// lookupGap, set by tests only, runs in that moment, with no lock
	// held: an event applied there lands in the middle of a walk.
	lookupGap func()
	// parkGap, set by tests only (before any listener starts), runs in an
	// ingest loop's check before it parks, between its look at the inner
	// set and its look at the outer one: an edge there must not be lost.
	parkGap func()
}

// New returns an empty index.
func New() *Index {
	x := &Index{lookupHold: lookupHoldDefault, turnHold: turnSlice}
	x.parts.Store(&map[selection.PartitionKey]*tree{})
	return x
}

// ConfigurePartition sets a partition's block size and Eagle mode; events
// are hashed with them. Changing them drops the partition's content.
func (x *Index) ConfigurePartition(p selection.PartitionKey, blockSize int, eagle bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	parts := *x.parts.Load()
	if t := parts[p]; t != nil {
		if t.blockSize == blockSize && t.eagle == eagle {
			return
		}
		t.mu.Lock()
		for _, m := range t.ranks {
			x.entries.Add(-int64(m.Len()))
			x.released.Add(int64(m.Len()))
		}
		t.mu.Unlock()
		defer x.releaseMemory()
	}
	next := maps.Clone(parts)
	next[p] = newTree(blockSize, eagle)
	x.parts.Store(&next)
}

func (x *Index) tree(p selection.PartitionKey) *tree { return (*x.parts.Load())[p] }

// ErrUnknownParent is returned when a store's parent is not indexed for
// its rank: the store is dropped (never re-rooted), which is the symptom
// that calls for a replay.
var ErrUnknownParent = errors.New("parent block not indexed for this rank")

// ErrTokenCount is returned when a store's token ids do not fill exactly
// its blocks: engines publish full blocks only, so the event is malformed,
// and storing the blocks its tokens do cover would index a guess.
var ErrTokenCount = errors.New("token ids do not match the stored blocks")

// ErrBlockSpan is returned when a store's engine blocks each cover more
// than 4,095 of ours (maxSpan): an entry records how many of our blocks it
// covers in 12 bits, and no engine pages its cache in blocks that large.
// A listener counts it as rejected.
var ErrBlockSpan = errors.New("engine blocks span more than 4095 of ours")

// ErrPartitionFull is returned when a store would take a partition past
// the records or holders its 28-bit refs can name (record.go): 134M
// blocks, far past any memory budget (EntriesForMemory). A listener
// counts it as rejected.
var ErrPartitionFull = errors.New("partition holds as many blocks as it can index")

// Apply applies one decoded event for a rank of partition p; it is
// ApplyBatch for one event, returning the index's refusal as an error.
func (x *Index) Apply(p selection.PartitionKey, r selection.Rank, ev *Event) (err error) {
	one := [1]Event{*ev}
	x.applyEvents(p, r, one[:], func(e error) { err = e })
	return err
}

// Blocks returns how many (block, rank) entries a rank holds.
func (x *Index) Blocks(p selection.PartitionKey, r selection.Rank) int {
	t := x.tree(p)
	if t == nil {
		return 0
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.ranks[r].Len()
}

// Entries returns the (block, rank) entries over all partitions.
func (x *Index) Entries() int64 { return x.entries.Load() }

// Interface guards
var (
	_ selection.Indexer      = (*Index)(nil)
	_ selection.ChainIndexer = (*Index)(nil)
)
