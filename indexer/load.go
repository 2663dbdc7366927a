package indexer

import (
	"fmt"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// LoadDump applies dumped events (Dump's) to partition p, which must be
// configured. Events carry our local hashes, so no tokens are needed. The
// tests use it to show that a dump rebuilds the same index, and kvsim to
// measure what a placement costs rebuilt alone (--index-memory). It trusts
// its events: nothing a publisher or a client sends reaches it.
func (x *Index) LoadDump(p selection.PartitionKey, events []selection.RouterEvent) error {
	t := x.tree(p)
	if t == nil {
		return fmt.Errorf("partition %s is not configured", p)
	}
	t.lockWrite()
	defer x.evictOver(nil, selection.Rank{}) // runs after the unlock below
	defer t.unlockWrite()
	defer t.flushEntries(x) // before the unlock
	for _, ev := range events {
		r := selection.Rank{WorkerID: ev.WorkerID, DPRank: ev.Event.DPRank}
		tier := Device
		for i, name := range tierNames {
			if name == ev.StorageTier {
				tier = Tier(i)
			}
		}
		m := t.ranks[r]
		if m == nil {
			m = t.addRank(x, r, 0)
		}
		id := m.rank
		st := ev.Event.Data.Stored
		var key uint64
		var rec uint32
		have := false
		if st.ParentHash != nil {
			e := m.get(*st.ParentHash)
			if e == 0 {
				x.counters.unknownParent.add(1)
				continue
			}
			_, rec, _ = t.entryOf(e)
			key, have = t.recs.at(rec).key, true
		}
		for _, b := range st.Blocks {
			if have {
				key = nextKey(key, b.TokensHash)
			} else {
				key = b.TokensHash
			}
			rec = t.extend(key, t.nodes.hashOf(key), rec, have, b.TokensHash)
			have = true
			t.hold(x, m, id, []uint32{rec}, b.BlockHash, m.hashOf(b.BlockHash), tier)
		}
	}
	return nil
}
