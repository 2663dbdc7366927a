package selection

import (
	"cmp"
	"io"
	"slices"

	json "github.com/goccy/go-json"
)

// GET /dump (docs/selection-api.md, "GET /dump") returns every partition's index as replayable
// events. An index can hold millions of blocks, so the dump is capped
// (Config.MaxDumpEvents, over all partitions) and streamed: partitions are
// written one at a time, event by event, and at most the capped events are
// ever held in memory. A partition the cap cut carries "truncated": true
// (our extension; Dynamo's dump has no cap). Its events are still a prefix
// in parent-first order, so replaying them rebuilds the part they cover.

// DumpLimiter is implemented by indexes that can dump part of a partition
// without building all of it. limit ≤ 0 means no limit; truncated reports
// that the partition held more than limit events. The router uses it for
// the dump cap when the index has it; otherwise it dumps whole partitions
// and cuts them, which bounds the answer but not the memory.
type DumpLimiter interface {
	DumpLimit(p PartitionKey, limit int) (events []RouterEvent, truncated bool)
}

// DumpPartition is one partition's entry in Dump.
type DumpPartition struct {
	BlockSize uint32        `json:"block_size"`
	Events    []RouterEvent `json:"events"`
	// Truncated is set when MaxDumpEvents cut the partition's events.
	Truncated bool `json:"truncated,omitempty"`
}

// Dump returns every partition's index as replayable events, keyed
// "model:group", at most MaxDumpEvents of them in all.
// WriteDump streams the same without holding every partition at once.
func (q *Queries) Dump() map[string]DumpPartition {
	out := map[string]DumpPartition{}
	_ = q.dumpEach(func(key string, d DumpPartition) error {
		out[key] = d
		return nil
	})
	return out
}

// WriteDump writes the JSON body of GET /dump to w: Dump's object, one
// partition (in key order) and one event at a time. It stops at the first
// write error.
func (q *Queries) WriteDump(w io.Writer) error {
	if _, err := io.WriteString(w, "{"); err != nil {
		return err
	}
	first := true
	err := q.dumpEach(func(key string, d DumpPartition) error {
		if !first {
			if _, err := io.WriteString(w, ","); err != nil {
				return err
			}
		}
		first = false
		return writePartition(w, key, &d)
	})
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, "}")
	return err
}

func writePartition(w io.Writer, key string, d *DumpPartition) error {
	k, err := json.Marshal(key)
	if err != nil {
		return err
	}
	head, err := json.Marshal(d.BlockSize)
	if err != nil {
		return err
	}
	if _, err := w.Write(slices.Concat(k, []byte(`:{"block_size":`), head, []byte(`,"events":[`))); err != nil {
		return err
	}
	for i := range d.Events {
		b, err := json.Marshal(&d.Events[i])
		if err != nil {
			return err
		}
		if i > 0 {
			if _, err := io.WriteString(w, ","); err != nil {
				return err
			}
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	tail := "]}"
	if d.Truncated {
		tail = `],"truncated":true}`
	}
	_, err = io.WriteString(w, tail)
	return err
}

// dumpEach calls fn on every partition in key order, with its events
// under the remaining share of MaxDumpEvents. Only one partition's events
// are held at a time.
func (q *Queries) dumpEach(fn func(key string, d DumpPartition) error) error {
	parts := q.catalog.partitions("", "")
	slices.SortFunc(parts, func(a, b *partition) int { return cmp.Compare(a.key.String(), b.key.String()) })
	limit := q.cfg.get().MaxDumpEvents
	remaining := limit
	for _, p := range parts {
		p.mu.Lock()
		d := DumpPartition{BlockSize: p.blockSize}
		p.mu.Unlock()
		switch {
		case limit <= 0:
			d.Events = q.index.Dump(p.key)
		case remaining == 0:
			// The cap is spent: say only whether there was more.
			some, _ := q.dumpLimit(p.key, 1)
			d.Truncated = len(some) > 0
		default:
			d.Events, d.Truncated = q.dumpLimit(p.key, remaining)
			remaining -= len(d.Events)
		}
		if d.Events == nil {
			d.Events = []RouterEvent{}
		}
		if err := fn(p.key.String(), d); err != nil {
			return err
		}
	}
	return nil
}

// dumpLimit dumps at most limit (> 0) events of a partition.
func (q *Queries) dumpLimit(k PartitionKey, limit int) ([]RouterEvent, bool) {
	if dl, ok := q.index.(DumpLimiter); ok {
		ev, truncated := dl.DumpLimit(k, limit)
		if len(ev) > limit { // an index that overshot
			ev, truncated = ev[:limit], true
		}
		return ev, truncated
	}
	ev := q.index.Dump(k)
	if len(ev) > limit {
		return ev[:limit:limit], true
	}
	return ev, false
}
