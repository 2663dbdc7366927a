package indexer

// Growing a large table beside its lookups. A table that doubles copies
// every key into an array twice its size, and it did so under the
// partition's write lock, in the middle of the store that took it past its
// load bound: lookups of the model waited 0.8–1.2 s for tables of 1M and
// 2M keys in the probe (RELIABILITY.md), 220–260 ms for a rank's tables
// growing to 1.4M keys in BenchmarkGrowHold. Writes are therefore taken in two locks: writeMu, which
// only writers take, then mu, which lookups share (lockWrite). A table of
// growAsideMin buckets or more that passes its load bound (7/8) takes its
// next keys as it is, up to 15/16 of its slots, and is grown once the
// write releases mu but still holds writeMu (unlockWrite): other writers
// wait as they would have, lookups go on reading the table as it was, and
// they wait only for the new array to be put in place. A table that
// reaches 15/16 before then (one event of more keys than that slack)
// grows at once, as every smaller table does.

// growAsideMin is the smallest table, in buckets, that grows after the
// write lock is released: 4,096 buckets hold 43k keys, whose growth takes
// a few milliseconds here. A variable so that BenchmarkGrowHold can
// measure growth in the lock, the baseline.
var growAsideMin = 4096

// hardCapacityOf is how many keys b buckets hold while their growth waits
// for the lock's release.
func hardCapacityOf(b int) int { return b * bucketSlots * 15 / 16 }

// growLater reports whether the table, about to hold extra keys more than
// it does, may take them without growing now; if so, it is put on its
// tree's list to grow after the write (unlockWrite). It runs under the
// write lock.
func (t *refTable) growLater(extra int) bool {
	if len(t.buckets) < growAsideMin || t.n+extra > hardCapacityOf(len(t.buckets)) {
		return false
	}
	if !t.growing {
		t.growing = true
		t.tree.toGrow = append(t.tree.toGrow, t)
	}
	return true
}

// lockWrite takes the tree for a write.
func (t *tree) lockWrite() {
	t.writeMu.Lock()
	t.mu.Lock()
}

// unlockWrite ends a write: it releases mu, grows the tables the write
// took past their load bound, and releases writeMu.
func (t *tree) unlockWrite() {
	grow := t.toGrow
	t.toGrow = nil
	t.mu.Unlock()
	for _, tab := range grow {
		t.growAside(tab)
	}
	t.writeMu.Unlock()
}

// growAside doubles table tab into a new array, reading it without mu
// (writeMu keeps every writer out, and lookups only read), and puts the
// array in place under mu. A table that was replaced meanwhile (rebuilt,
// its rank cleared) or has already grown is left alone.
func (t *tree) growAside(tab *refTable) {
	tab.growing = false
	if !t.holds(tab) || tab.n <= capacityOf(len(tab.buckets)) {
		return
	}
	buckets, shift := tab.laidOut(2 * len(tab.buckets))
	t.mu.Lock()
	tab.buckets, tab.shift = buckets, shift
	t.mu.Unlock()
}

// holds reports whether tab is one of the tree's tables in use.
func (t *tree) holds(tab *refTable) bool {
	if !tab.engines {
		return tab == t.nodes
	}
	m, ok := t.ranks[t.rankList[tab.rank]]
	return ok && m == tab
}
