package indexer

// Figure is one number of a Snapshot as the gateway reports it: under
// Section and Key in the admin route's JSON (/kv_router/stats) and, when
// Metric is set, as a Prometheus metric. One table serves both, so a new
// counter is added once and the two reports cannot drift apart.
type Figure struct {
	Section string // the object of the stats JSON that holds it: "kv_events" or "index"
	Key     string // its key in that object
	// Metric is its Prometheus name without the exporter's prefix, or ""
	// for figures reported on the admin route only.
	Metric string
	Help   string
	Gauge  bool // a level that can go down, not a count
	Value  func(*Snapshot) uint64
}

// The sections of Figures.
const (
	SectionEvents = "kv_events"
	SectionIndex  = "index"
)

// Figures lists every figure of a Snapshot. Keys and metric names are
// public interfaces (dashboards, alerts, scripts): rename none.
var Figures = []Figure{
	{SectionEvents, "listeners", "kv_event_listeners", "Per-rank KV-event listeners running.", true,
		func(s *Snapshot) uint64 { return uint64(max(s.Listeners, 0)) }},
	eventCounter("messages", "KV-event messages received live from worker publishers.",
		func(c *EventCounts) uint64 { return c.Messages }),
	eventCounter("batches", "KV-event batches applied to the index, live or replayed.",
		func(c *EventCounts) uint64 { return c.Batches }),
	eventCounter("malformed", "KV-event frames or payloads that could not be decoded and were skipped.",
		func(c *EventCounts) uint64 { return c.Malformed }),
	eventCounter("stale", "KV-event messages dropped as duplicates of sequences already applied.",
		func(c *EventCounts) uint64 { return c.Stale }),
	eventCounter("gaps", "Gaps in publishers' sequence numbers, late joins included.",
		func(c *EventCounts) uint64 { return c.Gaps }),
	eventCounter("replays", "Replay requests made to publishers' replay endpoints.",
		func(c *EventCounts) uint64 { return c.Replays }),
	eventCounter("replayed", "KV-event batches recovered by replay.",
		func(c *EventCounts) uint64 { return c.Replayed }),
	eventCounter("lost", "KV-event batches missed and not recovered.",
		func(c *EventCounts) uint64 { return c.Lost }),
	eventCounter("restarts", "Publisher restarts detected (sequence went back); the rank's blocks were dropped.",
		func(c *EventCounts) uint64 { return c.Restarts }),
	eventCounter("rejected", "KV events the index refused, such as stores whose parent block it does not hold.",
		func(c *EventCounts) uint64 { return c.Rejected }),
	eventCounter("jumps", "Publisher sequence jumps past kv_events_max_gap, taken as restarts (the rank's blocks were dropped), not as lost events.",
		func(c *EventCounts) uint64 { return c.Jumps }),
	eventCounter("unknown_rank", "KV-event batches dropped because their dp_rank is not one of the worker's ranks.",
		func(c *EventCounts) uint64 { return c.UnknownRank }),
	eventCounter("disconnects", "Publisher connections that dropped (the publisher went away, or a libzmq SUB refused an oversized message) and were dialed again.",
		func(c *EventCounts) uint64 { return c.Disconnects }),
	eventCounter("behind", "Live KV-event batches applied 2 s or more later than their publisher's other batches: the listener is falling behind.",
		func(c *EventCounts) uint64 { return c.Behind }),
	eventCounter("cut", "Publisher connections a listener cut off: a message of more than three frames or over kv_events_max_message, a command over 1 KiB or too many inside a message, or a bind-mode stream that is not ZMTP 3 with NULL security.",
		func(c *EventCounts) uint64 { return c.Cut }),
	eventCounter("turned_away", "Publisher connections a bind-mode listener refused: it already held kv_events_max_peers publishers.",
		func(c *EventCounts) uint64 { return c.TurnedAway }),
	eventCounter("wrong_topic", "Publisher connections a bind-mode listener cut off for their topic: a worker the catalog does not know, one on another host (kv_events_bind_peers worker_host), or a second topic on one connection.",
		func(c *EventCounts) uint64 { return c.WrongTopic }),
	eventCounter("dial_failures", "Connect-mode dials of a publisher that did not end in a subscription: refused, unanswered, or not a ZMTP 3 publisher with NULL security.",
		func(c *EventCounts) uint64 { return c.DialFailures }),

	{SectionIndex, "entries", "index_entries", "(block, worker rank) entries in the KV index.", true,
		func(s *Snapshot) uint64 { return uint64(max(s.Index.Entries, 0)) }},
	{SectionIndex, "max_entries", "", "The bound on the KV index's entries (from index_max_memory); 0 means none.", true,
		func(s *Snapshot) uint64 { return uint64(max(s.Index.MaxEntries, 0)) }},
	{SectionIndex, "full", "index_full_total", "Blocks stored while the KV index was at its bound (each evicted an older entry).", false,
		func(s *Snapshot) uint64 { return s.Index.Full }},
	{SectionIndex, "evicted", "index_evicted_total", "KV index entries evicted to keep the index within index_max_memory: the oldest of the ranks over their share of it.", false,
		func(s *Snapshot) uint64 { return s.Index.Evicted }},
	{SectionIndex, "unknown_block", "index_unknown_blocks_total", "Removals of blocks the index did not hold for that rank.", false,
		func(s *Snapshot) uint64 { return s.Index.UnknownBlock }},
	{SectionIndex, "applied", "", "KV events applied to the index.", false,
		func(s *Snapshot) uint64 { return s.Index.Applied }},
	{SectionIndex, "skipped", "", "KV events ignored by rule: another attention group, an unknown medium, a remote locality.", false,
		func(s *Snapshot) uint64 { return s.Index.Skipped }},
	{SectionIndex, "unknown_parent", "", "Stores dropped because their parent block is not indexed for the rank.", false,
		func(s *Snapshot) uint64 { return s.Index.UnknownParent }},
	{SectionIndex, "token_count_mismatch", "", "Stores dropped because their token ids do not fill exactly their blocks.", false,
		func(s *Snapshot) uint64 { return s.Index.TokenCount }},
}

// eventCounter is the Figure of a listener counter: the key under
// kv_events and the metric kv_events_<key>_total.
func eventCounter(key, help string, of func(*EventCounts) uint64) Figure {
	return Figure{SectionEvents, key, "kv_events_" + key + "_total", help, false,
		func(s *Snapshot) uint64 { return of(&s.Events) }}
}
