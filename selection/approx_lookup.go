package selection

import "sync"

// rankScanMax is how many ranks a lookup finds by scanning its list; past
// it, by a map (a scan per hold per edge made a lookup over a prefix that
// 4,096 ranks hold take 0.6 s).
const rankScanMax = 16

// rankPositions maps each rank of a lookup's list to its position.
type rankPositions struct{ of map[Rank]int }

var rankPositionsPool = sync.Pool{New: func() any { return &rankPositions{of: make(map[Rank]int)} }}

// rankPositionsOf indexes list[start:]: the ranks a lookup's first edge
// named, the only ones it can credit further.
func rankPositionsOf(list []Match, start int) *rankPositions {
	at := rankPositionsPool.Get().(*rankPositions)
	for i := start; i < len(list); i++ {
		at.of[list[i].Rank] = i
	}
	return at
}

// find is r's position in list[start:], -1 when absent; by a scan when at
// is nil.
func (at *rankPositions) find(list []Match, start int, r Rank) int {
	if at != nil {
		if i, ok := at.of[r]; ok {
			return i
		}
		return -1
	}
	for i := start; i < len(list); i++ {
		if list[i].Rank == r {
			return i
		}
	}
	return -1
}

func (at *rankPositions) put() {
	if at != nil {
		clear(at.of)
		rankPositionsPool.Put(at)
	}
}
