package caddymodule

import (
	"fmt"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/kvrouter/caddy-kvrouter/indexer"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Limits bound what a client of the selection API or a KV-event publisher
// can make the gateway hold: a registration, a booking, a dump, an event
// message, the index. Every bound has a default, so an unconfigured
// gateway is bounded too; an input past a bound is refused with a 4xx
// (API) or dropped and counted (events), never allocated first. The
// fields sit at the top level of the kv_router app (the struct is
// embedded), next to its other settings.
type Limits struct {
	// MaxRanksPerWorker bounds a worker's data_parallel_size. A
	// registration past it is refused with 422 before any per-rank state
	// exists. Default: 256.
	MaxRanksPerWorker int `json:"max_ranks_per_worker,omitempty"`

	// MaxRanks bounds the data-parallel ranks of the whole catalog; each
	// rank has its own KV-event subscription (about eight file descriptors
	// with its socket monitor) and its own load. A registration past it is
	// refused with 409, so the ranks can never use up the descriptors the
	// gateway needs to accept connections. Default: 4096, or fewer when the
	// process's descriptor limit is lower: what the limit holds after 4,096
	// descriptors are set aside (1,988 ranks with a 20,000 limit), or half
	// of a limit of 8,192 or less (256 ranks with a 4,096 limit).
	MaxRanks int `json:"max_ranks,omitempty"`

	// MaxReservationsPerWorker bounds the outstanding reservations on one
	// worker rank; a rank at the bound is not chosen for new bookings, and
	// a request no rank can take is answered 503. Default: 4096.
	MaxReservationsPerWorker int `json:"max_reservations_per_worker,omitempty"`

	// MaxReservationsPerClient bounds the outstanding reservations one
	// client address holds through the selection API (select_and_reserve
	// and reservations it never frees stay booked for reservation_ttl);
	// past it, 429. The proxy path's own bookings are bounded by its
	// requests in flight and not counted. Default: 1024.
	MaxReservationsPerClient int `json:"max_reservations_per_client,omitempty"`

	// MaxReservationBlocksPerClient bounds the prompt blocks the
	// outstanding selection-API reservations of one client address cover
	// (each block up to about 50 bytes, held until the reservation is
	// freed or expires); past it, 429. Not counted for the proxy path, as
	// above. Default: 4194304 (at most about 200 MB), 1,024 reservations
	// of 64k-token prompts at 16 tokens a block.
	MaxReservationBlocksPerClient int `json:"max_reservation_blocks_per_client,omitempty"`

	// MaxDumpEvents bounds the events GET /dump answers with, over all
	// partitions; a partition cut short is marked truncated. Default:
	// 100000.
	MaxDumpEvents int `json:"max_dump_events,omitempty"`

	// IndexMaxMemory is the memory, in bytes, the KV index may make the
	// process hold: its live entries (at most 96 bytes each, in the
	// dearest case) and what the Go runtime holds above them (the heap
	// grows to twice what is live between collections, and freed spans are
	// kept for reuse: about three times the live heap in all), so 2 GiB
	// holds about 7.5 million (block, worker rank) entries. It sets the index's entry bound
	// (index_max_entries wins when given); when the index is full, the
	// oldest entries of the worker ranks over their share of the bound are
	// evicted so that new blocks still count, a block looked up since it
	// was stored getting a second chance. At least 16MiB (about 58,000
	// entries; index_max_entries sets a smaller index). Without KV
	// events (use_kv_events off) it bounds the approximate index instead,
	// at a third of it for the same headroom: past that, the holds
	// soonest to expire are evicted (kvrouter_approx_index_evicted_total).
	// Default: 2GiB.
	IndexMaxMemory int64 `json:"index_max_memory,omitempty"`

	// KVEventsMaxMessage bounds one KV-event message, in bytes, all its
	// frames together, and one replay reply: a publisher's connection (or
	// replay exchange) is cut at the header of the frame that passes it,
	// before that frame is read (kvrouter_kv_events_cut_total); through
	// libzmq (an inproc:// endpoint) a reply's frames are bounded one by
	// one. A listener holds one message of its publisher at a time (a
	// libzmq SUB up to 64), so this also bounds what one publisher can make
	// the gateway hold. At least 4KiB: below it every real batch is cut.
	// Default: 4MiB: an engine publishes a batch per scheduler step, tens
	// of KB with chunked prefill, and 4 MiB holds a whole prompt of several
	// hundred thousand tokens stored in one step.
	KVEventsMaxMessage int64 `json:"kv_events_max_message,omitempty"`

	// KVEventsMaxGap is the largest jump in a publisher's sequence numbers
	// taken as missed events; a larger jump is taken as a restart (or
	// garbage): the rank's blocks are dropped, nothing is counted lost.
	// Default: 100000, ten times vLLM's replay buffer.
	KVEventsMaxGap uint64 `json:"kv_events_max_gap,omitempty"`

	// KVEventsMaxPeers bounds the publishers connected at once to the
	// kv_events_bind endpoint, which any peer that reaches it may dial; a
	// further connection is closed at once and counted
	// (kvrouter_kv_events_turned_away_total). Default: 4096, four times a
	// fleet of 1,024 one-rank workers, for publishers that dial again
	// before their old connection is seen to close.
	KVEventsMaxPeers int `json:"kv_events_max_peers,omitempty"`

	// KVEventsCores is how many cores KV-event ingest may use: the
	// number of ingest loops (each receives for a share of the
	// listeners) and of goroutines that may decode and apply payloads at
	// once. Go schedules every goroutine alike, so ingest busy on every
	// core makes requests wait behind it; with a core left over, a
	// request finds one while events pour in, and a flood of events waits
	// in the listeners' bounded queues instead (counted in
	// kv_events.behind when it falls behind). Default: every core but one
	// (GOMAXPROCS - 1), at least 1.
	KVEventsCores int `json:"kv_events_cores,omitempty"`
}

// The defaults of the bounds that are not the selection engine's own.
const (
	DefaultIndexMaxMemory = 2 << 30
)

// apply sets the selection engine's bounds in cfg.
func (l *Limits) apply(cfg *selection.Config) error {
	setInt := func(dst *int) func(int64) { return func(v int64) { *dst = int(v) } }
	if err := applyCounts([]countSetting{
		{"max_ranks_per_worker", int64(l.MaxRanksPerWorker), setInt(&cfg.MaxRanksPerWorker)},
		{"max_ranks", int64(l.MaxRanks), setInt(&cfg.MaxRanks)},
		{"max_reservations_per_worker", int64(l.MaxReservationsPerWorker), setInt(&cfg.MaxReservationsPerRank)},
		{"max_reservations_per_client", int64(l.MaxReservationsPerClient), setInt(&cfg.MaxReservationsPerClient)},
		{"max_reservation_blocks_per_client", int64(l.MaxReservationBlocksPerClient), setInt(&cfg.MaxReservationBlocksPerClient)},
		{"max_dump_events", int64(l.MaxDumpEvents), setInt(&cfg.MaxDumpEvents)},
	}); err != nil {
		return err
	}
	if l.MaxRanks == 0 {
		if n := ranksForDescriptors(); n > 0 && n < cfg.MaxRanks {
			cfg.MaxRanks = n
		}
	}
	if l.IndexMaxMemory < 0 || l.KVEventsMaxMessage < 0 || l.KVEventsCores < 0 || l.KVEventsMaxPeers < 0 {
		return fmt.Errorf("index_max_memory, kv_events_max_message, kv_events_cores and kv_events_max_peers must not be negative")
	}
	if l.KVEventsMaxMessage > 0 && l.KVEventsMaxMessage < minMaxMessage {
		// An operator probe set 10 bytes: every message was cut, the
		// index stayed empty, and nothing said why.
		return fmt.Errorf("kv_events_max_message %d is below %d bytes, which every real batch passes", l.KVEventsMaxMessage, minMaxMessage)
	}
	if l.IndexMaxMemory > 0 && l.IndexMaxMemory < minIndexMemory {
		// An operator probe set 1KB (meaning 1GB): the index held a few
		// entries, every store evicted another, and nothing said why.
		return fmt.Errorf("index_max_memory %d is below %d bytes (about %d entries); use index_max_entries for a smaller index",
			l.IndexMaxMemory, minIndexMemory, indexer.EntriesForMemory(minIndexMemory))
	}
	return nil
}

// minIndexMemory is index_max_memory's floor: about two engines' caches
// of 25k blocks each. It catches a unit slip (KB for GB); an index meant
// to be smaller is set in entries.
const minIndexMemory = 16 << 20

// minMaxMessage is kv_events_max_message's floor: a batch of a few
// blocks, with its topic and sequence frames.
const minMaxMessage = 4 << 10

// eventLimits are the bounds of the KV-event side: the index's entry cap
// and the listeners' options.
type eventLimits struct {
	maxEntries int64
	// approxHeap bounds the approximate index (use_kv_events off), from
	// the same memory budget.
	approxHeap  int64
	ingestCores int // 0: the index's default
	manager     []indexer.ManagerOption
}

// events resolves the KV-event bounds; maxEntries is the app's explicit
// index_max_entries (0 when unset).
func (l *Limits) events(maxEntries int64) eventLimits {
	budget := l.IndexMaxMemory
	if budget == 0 {
		budget = DefaultIndexMaxMemory
	}
	if maxEntries == 0 {
		maxEntries = indexer.EntriesForMemory(budget)
	}
	var opts []indexer.ManagerOption
	if l.KVEventsMaxMessage > 0 {
		opts = append(opts, indexer.WithMaxMessageBytes(l.KVEventsMaxMessage))
	}
	if l.KVEventsMaxGap > 0 {
		opts = append(opts, indexer.WithMaxGap(l.KVEventsMaxGap))
	}
	if l.KVEventsMaxPeers > 0 {
		opts = append(opts, indexer.WithMaxPeers(l.KVEventsMaxPeers))
	}
	return eventLimits{maxEntries: maxEntries, approxHeap: indexer.LiveHeapForMemory(budget), ingestCores: l.KVEventsCores, manager: opts}
}

// unmarshalCaddyfile reads one bound's subdirective; handled is false for
// any other name.
func (l *Limits) unmarshalCaddyfile(d *caddyfile.Dispenser) (handled bool, err error) {
	switch d.Val() {
	case "max_ranks_per_worker":
		l.MaxRanksPerWorker, err = parseCount(d)
	case "max_ranks":
		l.MaxRanks, err = parseCount(d)
	case "max_reservations_per_worker":
		l.MaxReservationsPerWorker, err = parseCount(d)
	case "max_reservations_per_client":
		l.MaxReservationsPerClient, err = parseCount(d)
	case "max_reservation_blocks_per_client":
		l.MaxReservationBlocksPerClient, err = parseCount(d)
	case "max_dump_events":
		l.MaxDumpEvents, err = parseCount(d)
	case "index_max_memory":
		l.IndexMaxMemory, err = parseSize(d)
	case "kv_events_max_message":
		l.KVEventsMaxMessage, err = parseSize(d)
	case "kv_events_max_gap":
		l.KVEventsMaxGap, err = parseUint64(d)
	case "kv_events_cores":
		l.KVEventsCores, err = parseCount(d)
	case "kv_events_max_peers":
		l.KVEventsMaxPeers, err = parseCount(d)
	default:
		return false, nil
	}
	return true, err
}
