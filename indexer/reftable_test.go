package indexer

import (
	"math/rand/v2"
	"testing"
	"time"
)

// keyedTable returns a node table and a function giving each key a
// record carrying it (refTable reads keys through records).
func keyedTable(n int) (*refTable, func(k uint64) uint32) {
	tr := newTree(4, false)
	tab := newRefTable(n, tr, false)
	tr.nodes = tab // the tree's node table, so that it grows aside (grow.go)
	recs := map[uint64]uint32{}
	return tab, func(k uint64) uint32 {
		r, ok := recs[k]
		if !ok {
			r = tr.recs.alloc()
			tr.recs.at(r).key = k
			recs[k] = r
		}
		return r
	}
}

// TestRefTableAgainstMap drives a table and a Go map with the same random
// claims and deletes, over a small key space so that keys collide, fill
// buckets, probe past them around the array's end and leave them again,
// and checks that they agree throughout.
func TestRefTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tab, recOf := keyedTable(0)
	want := map[uint64]uint32{}
	keys := []uint64{0, 1, 1 << 63, ^uint64(0)}
	for range 600 {
		keys = append(keys, rng.Uint64())
	}
	for step := range 200_000 {
		k := keys[rng.IntN(len(keys))]
		switch rng.IntN(3) {
		case 0, 1:
			c := tab.claim(k)
			if _, ok := want[k]; ok != c.held {
				t.Fatalf("step %d: claim(%x) held=%v, map has it: %v", step, k, c.held, ok)
			}
			if !c.held {
				c.fill(recOf(k))
				want[k] = recOf(k)
			}
		case 2:
			_, ok := want[k]
			if tab.del(k) != ok {
				t.Fatalf("step %d: del(%x) disagrees with the map (%v)", step, k, ok)
			}
			delete(want, k)
		}
		if tab.Len() != len(want) {
			t.Fatalf("step %d: %d keys, map has %d", step, tab.Len(), len(want))
		}
		if step%1000 == 0 {
			checkPassed(t, tab)
		}
	}
	checkPassed(t, tab)
	for _, k := range keys {
		if got := tab.get(k); got != want[k] {
			t.Fatalf("get(%x) = %d; map %d", k, got, want[k])
		}
	}
	seen := 0
	tab.each(func(r uint32) {
		if k := tab.keyOf(r); want[k] != r {
			t.Fatalf("each yields %x=%d; map has %d", k, r, want[k])
		}
		seen++
	})
	if seen != len(want) {
		t.Fatalf("each yielded %d keys, want %d", seen, len(want))
	}
}

// checkPassed recounts, for every bucket, the held keys whose probe
// passed it (from the key's home bucket up to the one holding it) and
// fails where a bucket's count differs.
func checkPassed(t *testing.T, tab *refTable) {
	t.Helper()
	want := make([]uint32, len(tab.buckets))
	mask := len(tab.buckets) - 1
	for b := range tab.buckets {
		refs, n := tab.buckets[b].held()
		for _, r := range refs[:n] {
			for p := tab.homeOf(tab.hashOf(tab.keyOf(r))); p != b; p = (p + 1) & mask {
				want[p]++
			}
		}
	}
	for b, w := range want {
		if got := tab.buckets[b].passed; got != w {
			t.Fatalf("bucket %d of %d counts %d keys passing it, %d do", b, len(tab.buckets), got, w)
		}
	}
}

// TestRefTableFullBuckets: more keys share one home bucket than a bucket
// holds, so their probes pass full buckets (and wrap around the array's
// end); deleting them in random order keeps every other key found, and an
// emptied table has no bucket left counting a key that passed it.
func TestRefTableFullBuckets(t *testing.T) {
	tab, recOf := keyedTable(60) // 8 buckets, no growth below 84 keys
	if len(tab.buckets) != 8 {
		t.Fatalf("%d buckets", len(tab.buckets))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var keys []uint64
	for len(keys) < 3*bucketSlots+5 {
		if k := rng.Uint64(); tab.homeOf(tab.hashOf(k)) == 7 { // the probes wrap around the end
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		tab.claim(k).fill(recOf(k))
	}
	if tab.buckets[7].passed != uint32(len(keys)-bucketSlots) || tab.buckets[1].passed != 5 {
		t.Fatalf("passed counts %d, %d, %d", tab.buckets[7].passed, tab.buckets[0].passed, tab.buckets[1].passed)
	}
	rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	for i, k := range keys {
		if !tab.del(k) {
			t.Fatalf("del(%x) missed", k)
		}
		for _, o := range keys[i+1:] {
			if tab.get(o) != recOf(o) {
				t.Fatalf("after %d deletions, %x is not found", i+1, o)
			}
		}
	}
	if tab.Len() != 0 {
		t.Fatalf("%d keys left", tab.Len())
	}
	for b := range tab.buckets {
		if bk := tab.buckets[b]; bk.passed != 0 || bk.lo != 0 || bk.hi != 0 {
			t.Fatalf("bucket %d left as %+v", b, bk)
		}
	}
}

// TestRefTableTagsPickTheKey: keys that share a home bucket and a tag are
// told apart by their records, and a deletion by ref (delRef) takes the
// slot holding that ref, not another of the same tag.
func TestRefTableTagsPickTheKey(t *testing.T) {
	tab, recOf := keyedTable(8)
	rng := rand.New(rand.NewPCG(7, 8))
	var keys []uint64
	for len(keys) < 3 {
		if k := rng.Uint64(); tagOf(tab.hashOf(k)) == 0x5a && tab.homeOf(tab.hashOf(k)) == 0 {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		if c := tab.claim(k); c.held {
			t.Fatalf("%x claimed as held", k)
		} else {
			c.fill(recOf(k))
		}
	}
	for _, k := range keys {
		if tab.get(k) != recOf(k) {
			t.Fatalf("%x: got ref %d, want %d", k, tab.get(k), recOf(k))
		}
	}
	if !tab.delRef(keys[1], recOf(keys[1])) || tab.get(keys[1]) != 0 {
		t.Fatal("delRef did not take its own slot")
	}
	if tab.get(keys[0]) != recOf(keys[0]) || tab.get(keys[2]) != recOf(keys[2]) {
		t.Fatal("delRef took another key's slot")
	}
	if tab.delRef(keys[1], recOf(keys[1])) {
		t.Fatal("a second delRef of the same ref found it")
	}
}

// TestRefTableLoad checks the table grows to keep its load at 7/8 at most
// once a write is over (up to 15/16 during one, for a table that grows
// aside: grow.go), and that a table sized by newRefTable(n) takes n keys
// without growing. Writes of 1 to 500 keys.
func TestRefTableLoad(t *testing.T) {
	tab, recOf := keyedTable(1000)
	buckets := len(tab.buckets)
	for k := range uint64(1000) {
		tab.claim(k + 1).fill(recOf(k + 1))
	}
	if len(tab.buckets) != buckets {
		t.Fatalf("sized for 1,000 keys, grew from %d to %d buckets", buckets, len(tab.buckets))
	}
	rng := rand.New(rand.NewPCG(7, 8))
	aside := false
	for k := uint64(0); k < 200_000; {
		tab.tree.lockWrite()
		for range 1 + rng.IntN(500) {
			tab.claim(k + 5000).fill(recOf(k + 5000))
			k++
			if tab.Len()*16 > len(tab.buckets)*bucketSlots*15 {
				t.Fatalf("%d keys in %d buckets during a write", tab.Len(), len(tab.buckets))
			}
			aside = aside || tab.Len() > capacityOf(len(tab.buckets))
		}
		tab.tree.unlockWrite()
		if tab.Len() > capacityOf(len(tab.buckets)) {
			t.Fatalf("%d keys in %d buckets after a write", tab.Len(), len(tab.buckets))
		}
	}
	if !aside || len(tab.buckets) < 2*growAsideMin {
		t.Fatalf("no growth aside: %d buckets at the end", len(tab.buckets))
	}
	checkPassed(t, tab)
	for k := range uint64(200_000) {
		if tab.get(k+5000) != recOf(k+5000) {
			t.Fatalf("key %d lost", k+5000)
		}
	}
}

// TestRefTableHashesOutliveGrowth: hashes computed before the table grows
// stay good for claimAt (a hash does not depend on the table's size), and
// reserve(n) makes room for n claims without growing.
func TestRefTableHashesOutliveGrowth(t *testing.T) {
	tab, recOf := keyedTable(0)
	rng := rand.New(rand.NewPCG(5, 6))
	var all []uint64
	grewPast := 0 // claims that grew the table past a miscounted room
	for round := range 200 {
		n := 1 + rng.IntN(40)
		keys := make([]uint64, n)
		for i := range keys {
			keys[i] = rng.Uint64()
		}
		room := n
		if round%3 == 0 {
			room = n / 2 // miscounted: the claims past it must grow the table
		}
		tab.reserve(room)
		buckets := len(tab.buckets)
		hashes := make([]uint64, n)
		for i, k := range keys {
			hashes[i] = tab.hashOf(k)
		}
		for i, k := range keys {
			c := tab.claimAt(hashes[i], k)
			if c.held {
				t.Fatalf("round %d: new key %x claimed as held", round, k)
			}
			c.fill(recOf(k))
			if len(tab.buckets) != buckets {
				if i < room {
					t.Fatalf("round %d: grew within the reserved room (%d of %d)", round, i, room)
				}
				grewPast++
				buckets = len(tab.buckets)
			}
		}
		all = append(all, keys...)
		for _, k := range all {
			if tab.get(k) != recOf(k) {
				t.Fatalf("round %d: %x is not found", round, k)
			}
		}
	}
	if tab.Len() != len(all) {
		t.Fatalf("%d keys, want %d", tab.Len(), len(all))
	}
	if grewPast == 0 {
		t.Fatal("no claim ever grew the table past a miscounted room")
	}
}

// TestRefTableEveryBucketPassed: a table of two buckets, within its load
// bound, where a key homed at each bucket sits in the other, so no bucket
// has a passed count of 0. A probe for an absent key (find, claim,
// delete by ref) must still end; it used to go round for ever. Found by
// TestIndexEvictsConcurrently, whose lookups hung on a node table of 16
// buckets in that state.
func TestRefTableEveryBucketPassed(t *testing.T) {
	tab, recOf := keyedTable(0)
	if len(tab.buckets) != 2 {
		t.Fatalf("%d buckets", len(tab.buckets))
	}
	rng := rand.New(rand.NewPCG(5, 6))
	homed := func(b int) uint64 {
		for {
			if k := rng.Uint64(); tab.homeOf(tab.hashOf(k)) == b {
				return k
			}
		}
	}
	add := func(k uint64) uint64 { tab.claim(k).fill(recOf(k)); return k }
	var inOne []uint64
	for range bucketSlots {
		inOne = append(inOne, add(homed(1))) // bucket 1 full
	}
	add(homed(1)) // into bucket 0: bucket 1 is passed
	for _, k := range inOne[:4] {
		tab.del(k) // room in bucket 1 again
	}
	for range bucketSlots - 1 {
		add(homed(0)) // bucket 0 full
	}
	add(homed(0)) // into bucket 1: bucket 0 is passed
	checkPassed(t, tab)
	if tab.buckets[0].passed == 0 || tab.buckets[1].passed == 0 || tab.Len() > capacityOf(2) {
		t.Fatalf("set-up: passed %d and %d, %d keys", tab.buckets[0].passed, tab.buckets[1].passed, tab.Len())
	}
	absent := homed(0)
	done := make(chan [3]bool, 1)
	go func() {
		_, found := tab.find(absent)
		deleted := tab.delRef(absent, recOf(absent))
		c := tab.claim(absent)
		done <- [3]bool{found, deleted, c.held}
	}()
	select {
	case got := <-done:
		if got != [3]bool{} {
			t.Fatalf("an absent key: found %v, deleted %v, claimed as held %v", got[0], got[1], got[2])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a probe for an absent key did not end")
	}
}
