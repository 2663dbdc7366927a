package indexer

import (
	"reflect"
	"testing"
)

// TestStatsPartCoversEveryCounter: every counter of Stats is in all(), so
// a publisher's counts (part) reach the totals, and plus adds every field
// of EventCounts. A counter added to Stats and not to all() fails here
// instead of going missing from the totals, and Counts copies each
// counter to the field of its name.
func TestStatsPartCoversEveryCounter(t *testing.T) {
	var total Stats
	p := total.part()
	v := reflect.ValueOf(p).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		c, ok := f.Addr().Interface().(*Counter)
		if !ok {
			continue
		}
		c.add(uint64(i + 1))
		if got := reflect.ValueOf(&total).Elem().Field(i).Addr().Interface().(*Counter).Load(); got != uint64(i+1) {
			t.Errorf("Stats.%s: the total counts %d of a part's %d", v.Type().Field(i).Name, got, i+1)
		}
	}
	one, sum := p.Counts(), p.Counts().plus(p.Counts())
	a, b := reflect.ValueOf(one), reflect.ValueOf(sum)
	for i := range a.NumField() {
		name := a.Type().Field(i).Name
		if c := v.FieldByName(name).Addr().Interface().(*Counter); a.Field(i).Uint() != c.Load() {
			t.Errorf("EventCounts.%s reads %d, Stats.%s holds %d", name, a.Field(i).Uint(), name, c.Load())
		}
		if b.Field(i).Uint() != 2*a.Field(i).Uint() || a.Field(i).Uint() == 0 {
			t.Errorf("EventCounts.%s: %d plus itself gave %d", a.Type().Field(i).Name, a.Field(i).Uint(), b.Field(i).Uint())
		}
	}
}

// BenchmarkCounterAdd: what an add costs to a manager's totals alone (as
// before per-publisher counts) and to a publisher's counts that add to
// the totals as well (part), from one goroutine.
func BenchmarkCounterAdd(b *testing.B) {
	var total Stats
	for _, c := range []struct {
		name    string
		counter *Counter
	}{{"total_only", &total.Messages}, {"part_and_total", &total.part().Messages}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				c.counter.add(1)
			}
		})
	}
}
