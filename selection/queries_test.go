package selection

import (
	"testing"
)

func TestOverlapScoresTiersAndOverride(t *testing.T) {
	cfg := DefaultConfig()
	cfg.UseKVEvents = true
	r, err := NewRouter(cfg, WithIndexer(fixedIndex{{1, 0}: {Device: 2, Host: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, w := range []struct {
		id        uint64
		start, sz uint32
	}{{1, 0, 1}, {2, 2, 2}} {
		eps := map[string]string{}
		for i := w.start; i < w.start+w.sz; i++ {
			eps[string(rune('0'+i))] = "tcp://127.0.0.1:1"
		}
		addWorker(t, r, w.id, func(q *WorkerRequest) {
			q.BlockSize = ptr(uint32(4))
			q.DataParallelStartRank, q.DataParallelSize, q.KVEventsEndpoints = ptr(w.start), ptr(w.sz), eps
		})
	}
	res, err := r.Queries().OverlapScores(&ScoreRequest{Prompt: Prompt{TokenIDs: []uint32{1, 2, 3, 4, 5}},
		RouterConfigOverride: &RouterConfigOverride{OverlapScoreCredit: ptr(0.5)}})
	if err != nil {
		t.Fatal(err)
	}
	if res.NumBlocks != 1 || len(res.Workers) != 3 {
		t.Fatalf("%+v", res)
	}
	w0 := res.Workers[0]
	if w0.DeviceBlocks != 2 || w0.HostPinnedBlocks != 3 || w0.DiskBlocks != 3 || w0.HostPinnedExtensionBlocks != 1 || w0.RouterCreditBlocks != 1.75 {
		t.Fatalf("tiers %+v", w0)
	}
	if res.Workers[1].WorkerID != 2 || res.Workers[1].DPRank != 2 || res.Workers[2].DPRank != 3 || res.Workers[2].DeviceBlocks != 0 {
		t.Fatalf("rows %+v", res.Workers)
	}
	sel, err := r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 16)}})
	if err != nil || sel.WorkerID != 1 || sel.Overlap.GPU != 8 || sel.Overlap.CPU != 12 || sel.Overlap.Disk != 12 {
		t.Fatalf("select with tiers %+v %v", sel, err)
	}
}
