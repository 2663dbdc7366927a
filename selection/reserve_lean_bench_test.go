package selection

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkReserveLean100k is the proxy path's share of the router for a
// 100k-token prompt, as scripts/bench-proxy.sh drives it: two workers and
// two clients, each sending its own prompt again and again, one booking
// live per client. Each op books a prompt through the handle
// (Router.Reserve, lean), answers, completes prefill and releases it.
func BenchmarkReserveLean100k(b *testing.B) {
	r := benchRouter(b, 2)
	rng := rand.New(rand.NewPCG(15, 3))
	var prompts [2][]uint32
	for i := range prompts {
		prompts[i] = make([]uint32, 100_000)
		for k := range prompts[i] {
			prompts[i][k] = uint32(rng.IntN(150_000))
		}
	}
	b.ReportAllocs()
	var live [2]*Reservation
	i := 0
	for b.Loop() {
		c := i & 1
		i++
		if live[c] != nil {
			live[c].Release()
		}
		h, err := r.Reserve(&SelectRequest{Prompt: Prompt{TokenIDs: prompts[c]}, Lean: true}, false)
		if err != nil {
			b.Fatal(err)
		}
		h.Answered(200)
		h.PrefillDone()
		live[c] = h
	}
	for _, h := range live {
		if h != nil {
			h.Release()
		}
	}
}
