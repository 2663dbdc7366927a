package caddymodule

import (
	"slices"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestUpstreamsFollowWhatIsServed: the upstream list is the schedulable
// workers' dial addresses (one per address), made again when they change
// and not on another catalog write: under a few thousand writes a second
// of other fields, every request made it again, under one mutex
// (helper-54's probe: 23.5% of the gateway's CPU).
func TestUpstreamsFollowWhatIsServed(t *testing.T) {
	w := func(id uint64, endpoint string) selection.WorkerRequest {
		bs := uint32(16)
		return selection.WorkerRequest{WorkerID: &id, Endpoint: &endpoint, BlockSize: &bs}
	}
	router := routerWith(t, nil, w(1, "http://127.0.0.1:9001"), w(2, "127.0.0.1:9002"), w(3, "127.0.0.1:9002"))
	u := &Upstreams{router: router, cache: new(dialCache)}
	dials := func() []string {
		ups, err := u.GetUpstreams(nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, up := range ups {
			out = append(out, up.Dial)
		}
		return out
	}
	if got := dials(); !slices.Equal(got, []string{"127.0.0.1:9001", "127.0.0.1:9002"}) {
		t.Fatalf("upstreams %v", got)
	}
	before := u.cache.current.Load()
	longer := uint64(8192)
	if _, err := router.Catalog().PatchWorker(2, &selection.WorkerRequest{MaxModelLen: &longer}); err != nil {
		t.Fatal(err)
	}
	dials()
	if u.cache.current.Load() != before {
		t.Error("a write of a worker's context made the list again")
	}
	if _, err := router.Catalog().UpsertWorker(ptr(w(4, "127.0.0.1:9004"))); err != nil {
		t.Fatal(err)
	}
	if got := dials(); !slices.Equal(got, []string{"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9004"}) {
		t.Fatalf("after a worker joined: upstreams %v", got)
	}
	if _, err := router.Catalog().DeleteWorker(1); err != nil {
		t.Fatal(err)
	}
	if got := dials(); !slices.Equal(got, []string{"127.0.0.1:9002", "127.0.0.1:9004"}) {
		t.Fatalf("after a worker left: upstreams %v", got)
	}
}

// BenchmarkUpstreamsChurn: reverse_proxy's upstreams for a request at
// 1,024 workers, after a write of another field of one of them (its
// context) before each.
func BenchmarkUpstreamsChurn(b *testing.B) {
	var workers []selection.WorkerRequest
	for id := uint64(1); id <= 1024; id++ {
		workers = append(workers, contextWorker(id, 4096))
	}
	router := routerWith(b, nil, workers...)
	u := &Upstreams{router: router, cache: new(dialCache)}
	lens := [2]uint64{4096, 8192}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := router.Catalog().PatchWorker(1, &selection.WorkerRequest{MaxModelLen: &lens[i%2]}); err != nil {
			b.Fatal(err)
		}
		if ups, _ := u.GetUpstreams(nil); len(ups) != 1024 {
			b.Fatal(len(ups))
		}
	}
}
