package selection

import "github.com/zeebo/xxh3"

// IndexDigest is a cheap summary of one partition's prefix index, for
// replicas to compare (docs/replicas.md, "Index digests"): each follows
// the workers' KV events itself, so two replicas' indexes should hold the
// same entries. Entries counts the (rank, block, tier) entries and Xor
// folds a mix of each entry's worker, rank, tier and block hash, so two
// indexes with the same entries have the same digest whatever their order.
type IndexDigest struct {
	Partition string
	Entries   uint64
	Xor       uint64
	// Truncated is set when max_dump_events cut the partition: the digest
	// covers only part of it and compares with nothing.
	Truncated bool
}

// IndexDigests summarises every partition's index. It walks the index as
// GET /dump does (bounded by max_dump_events), so it costs what a dump
// costs: call it every few seconds, not per request.
func (q *Queries) IndexDigests() []IndexDigest {
	var out []IndexDigest
	_ = q.dumpEach(func(key string, d DumpPartition) error {
		dg := IndexDigest{Partition: key, Truncated: d.Truncated}
		for i := range d.Events {
			ev := &d.Events[i]
			tier := xxh3.HashString(ev.StorageTier)
			for _, b := range ev.Event.Data.Stored.Blocks {
				dg.Entries++
				dg.Xor ^= mix64(b.TokensHash ^ mix64(ev.WorkerID<<20^uint64(ev.Event.DPRank)<<4^tier))
			}
		}
		out = append(out, dg)
		return nil
	})
	return out
}

// mix64 is a 64-bit finaliser (SplitMix64's): it spreads every input bit
// over the output, so an xor of mixed entries rarely cancels by accident.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
