package selection

import (
	"cmp"
	"slices"
	"sync"
)

// partition is one (model, group): its settings, ranks and load.
type partition struct {
	key       PartitionKey
	blockSize uint32
	isEagle   bool

	mu     sync.Mutex
	ranks  []*rankState // schedulable ranks sorted by (worker, dp_rank)
	byRank map[Rank]*rankState
	load   loadTracker
}

// sortRanks orders ranks by (worker_id, dp_rank) and renumbers them.
func sortRanks(ranks []*rankState) {
	slices.SortFunc(ranks, func(a, b *rankState) int { return compareRanks(a.rank, b.rank) })
	for i, rs := range ranks {
		rs.idx = i
	}
}

// compareRanks orders ranks by worker id, then dp_rank.
func compareRanks(a, b Rank) int {
	if c := cmp.Compare(a.WorkerID, b.WorkerID); c != 0 {
		return c
	}
	return cmp.Compare(a.DPRank, b.DPRank)
}

// hasRank reports whether r is one of p's ranks now.
func (p *partition) hasRank(r Rank) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byRank[r] != nil
}
