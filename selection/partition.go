package selection

import (
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
	slices.SortFunc(ranks, func(a, b *rankState) int {
		if a.rank.WorkerID != b.rank.WorkerID {
			if a.rank.WorkerID < b.rank.WorkerID {
				return -1
			}
			return 1
		}
		return int(a.rank.DPRank) - int(b.rank.DPRank)
	})
	for i, rs := range ranks {
		rs.idx = i
	}
}
