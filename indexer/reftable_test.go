package indexer

import (
	"math/rand/v2"
	"testing"
)

// keyedTable returns a node table and a function giving each key a
// record carrying it (refTable reads keys through records).
func keyedTable(n int) (*refTable, func(k uint64) uint32) {
	tr := newTree(4, false)
	tab := newRefTable(n, tr, false)
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
// claims and deletes, over a small key space so that keys collide, probe
// runs wrap around the array and deletes shift keys back, and checks that
// they agree throughout.
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
	}
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

// TestRefTableLongRuns: keys that share one home slot make a run longer
// than a slot's distance bits count (distSat), where probes and deletions
// must read the keys; deleting them in random order keeps every other key
// found.
func TestRefTableLongRuns(t *testing.T) {
	tab, recOf := keyedTable(40) // 64 slots, no growth below 48 keys
	if len(tab.slots) != 64 {
		t.Fatalf("%d slots", len(tab.slots))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var keys []uint64
	for len(keys) < 2*distSat+5 {
		if k := rng.Uint64(); tab.home(k) == 60 { // the run wraps around the end
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		tab.claim(k).fill(recOf(k))
	}
	if d := tab.slots[(60+len(keys)-1)&63] >> distShift; d != distSat {
		t.Fatalf("the run's last slot is %d from home", d)
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
}

// TestRefTableLoad checks the table grows to keep its load at 3/4 at most
// and that a table sized by newRefTable(n) takes n keys without growing.
func TestRefTableLoad(t *testing.T) {
	tab, recOf := keyedTable(1000)
	slots := len(tab.slots)
	for k := range uint64(1000) {
		tab.claim(k + 1).fill(recOf(k + 1))
	}
	if len(tab.slots) != slots {
		t.Fatalf("sized for 1,000 keys, grew from %d to %d slots", slots, len(tab.slots))
	}
	for k := range uint64(100_000) {
		tab.claim(k + 5000).fill(recOf(k + 5000))
		if tab.Len()*4 > len(tab.slots)*3 {
			t.Fatalf("%d keys in %d slots", tab.Len(), len(tab.slots))
		}
	}
}

// TestRefTableClaimAtHomes: homes computed after reserve(n) stay valid
// for n claims (no growth between), and a claim past the reserved room
// grows the table and finds its home again instead of using the stale
// one, so every key stays found.
func TestRefTableClaimAtHomes(t *testing.T) {
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
		slots := len(tab.slots)
		slotsAtHomes := slots
		homes := make([]int, n)
		for i, k := range keys {
			homes[i] = tab.home(k)
		}
		for i, k := range keys {
			c := tab.claimAt(homes[i], slotsAtHomes, k)
			if c.held {
				t.Fatalf("round %d: new key %x claimed as held", round, k)
			}
			c.fill(recOf(k))
			if len(tab.slots) != slots {
				if i < room {
					t.Fatalf("round %d: grew within the reserved room (%d of %d)", round, i, room)
				}
				grewPast++
				slots = len(tab.slots)
			}
		}
		all = append(all, keys...)
		for _, k := range all { // before a later growth rehashes them all
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
