package selection

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

// One-off differential check (not committed): a seeded serial workload whose
// every response is written out, to diff between two versions.
func TestZZDecisions(t *testing.T) {
	out, _ := os.Create(os.Getenv("DECISIONS_OUT"))
	defer out.Close()
	for _, temp := range []float64{0, 0.3} {
		rng := rand.New(rand.NewPCG(42, uint64(temp*10)))
		cfg := DefaultConfig()
		cfg.UseKVEvents = false
		cfg.RouterTemperature = temp
		cfg.MaxReservationsPerRank = 6
		cfg.SessionAffinityTTL = time.Minute
		pick := rand.New(rand.NewPCG(7, 7))
		cfg.Rand = pick.Float64
		r, err := NewRouter(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for id := uint64(1); id <= 48; id++ {
			req := &WorkerRequest{WorkerID: ptr(id), Endpoint: ptr(fmt.Sprintf("127.0.0.1:%d", 9000+id)), BlockSize: ptr(uint32(16))}
			if id%5 == 0 {
				req.DataParallelSize = ptr(uint32(2))
			}
			if id%3 == 0 {
				req.Taints = []string{"fast"}
			}
			if _, err := r.Catalog().UpsertWorker(req); err != nil {
				t.Fatal(err)
			}
		}
		prefixes := make([][]uint32, 12)
		for i := range prefixes {
			for range 200 + rng.IntN(2000) {
				prefixes[i] = append(prefixes[i], uint32(rng.IntN(50000)))
			}
		}
		var live []string
		for op := 0; op < 3000; op++ {
			switch k := rng.IntN(10); {
			case k < 5 || len(live) == 0:
				toks := append([]uint32(nil), prefixes[rng.IntN(len(prefixes))]...)
				for range rng.IntN(300) {
					toks = append(toks, uint32(rng.IntN(50000)))
				}
				req := &SelectRequest{Prompt: Prompt{TokenIDs: toks}, SelectionID: fmt.Sprintf("s-%v-%d", temp, op)}
				switch rng.IntN(8) {
				case 0:
					req.Placement.SessionID = fmt.Sprintf("sess-%d", rng.IntN(10))
				case 1:
					req.Placement.RoutingConstraints = &RoutingConstraints{RequiredTaints: []string{"fast"}}
				case 2:
					req.Placement.RoutingConstraints = &RoutingConstraints{PreferredTaints: map[string]float32{"fast": 0.7}}
				case 3:
					req.Placement.ExcludeRanks = []Rank{{WorkerID: uint64(1 + rng.IntN(48))}}
					req.Placement.AllowedWorkerIDs = []uint64{1, 2, 3, 5, 8, 13, 21, 34}
				}
				var res *SelectResponse
				var err error
				switch rng.IntN(4) {
				case 0:
					res, err = r.Select(req)
				case 1:
					res, err = r.SelectAndReserveExplained(req)
				default:
					res, err = r.SelectAndReserve(req)
				}
				if err == nil && res.SequenceHashes != nil {
					live = append(live, res.SelectionID)
					res.SequenceHashes = nil
				}
				b, _ := json.Marshal(res)
				fmt.Fprintf(out, "%d select %s err=%v\n", op, b, err)
			case k < 7:
				i := rng.IntN(len(live))
				fmt.Fprintf(out, "%d free %v\n", op, r.Free(live[i]))
				live = append(live[:i], live[i+1:]...)
			case k < 8:
				fmt.Fprintf(out, "%d prefill %v\n", op, r.PrefillComplete(live[rng.IntN(len(live))]))
			default:
				d := 0.5
				fmt.Fprintf(out, "%d output %v\n", op, r.AddOutputBlock(live[rng.IntN(len(live))], &d))
			}
			if op%500 == 499 {
				b, _ := json.Marshal(r.Queries().Loads("", ""))
				fmt.Fprintf(out, "%d loads %s\n", op, b)
			}
		}
		r.Close()
	}
}
