package indexer

import (
	"math/rand/v2"
	"testing"
)

// TestTableAgainstMap drives a table and a Go map with the same random
// upserts and deletes, over a small key space so that keys collide, probe
// runs wrap around the array and deletes shift keys back, and checks that
// they agree throughout.
func TestTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tab := newTable[uint32](0)
	want := map[uint64]uint32{}
	keys := []uint64{0, 1, 1 << 63, ^uint64(0)}
	for range 600 {
		keys = append(keys, rng.Uint64())
	}
	for step := range 200_000 {
		k := keys[rng.IntN(len(keys))]
		switch rng.IntN(3) {
		case 0, 1:
			p, held := tab.upsert(k)
			if _, ok := want[k]; ok != held {
				t.Fatalf("step %d: upsert(%x) held=%v, map has it: %v", step, k, held, ok)
			}
			*p = uint32(step)
			want[k] = uint32(step)
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
		v, ok := tab.get(k)
		if w, wok := want[k]; ok != wok || v != w {
			t.Fatalf("get(%x) = %d,%v; map %d,%v", k, v, ok, w, wok)
		}
	}
	seen := 0
	for k, v := range tab.All() {
		if want[k] != v {
			t.Fatalf("All yields %x=%d; map has %d", k, v, want[k])
		}
		seen++
	}
	if seen != len(want) {
		t.Fatalf("All yielded %d keys, want %d", seen, len(want))
	}
}

// TestTableLoad checks the table grows to keep its load at 3/4 at most
// and that a table sized by newTable(n) takes n keys without growing.
func TestTableLoad(t *testing.T) {
	tab := newTable[struct{}](1000)
	slots := len(tab.slots)
	for k := range uint64(1000) {
		tab.upsert(k + 1)
	}
	if len(tab.slots) != slots {
		t.Fatalf("sized for 1,000 keys, grew from %d to %d slots", slots, len(tab.slots))
	}
	for k := range uint64(100_000) {
		tab.upsert(k + 5000)
		if tab.Len()*4 > len(tab.slots)*3 {
			t.Fatalf("%d keys in %d slots", tab.Len(), len(tab.slots))
		}
	}
}
