package selection

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// BenchmarkSelectAndReserve99k books (and frees) a 99k-token prompt in a
// partition of 1,024 workers whose approximate index already holds a
// shared 16k-token system prompt on 64 of them and each worker's own
// earlier prompts.
func BenchmarkSelectAndReserve99k(b *testing.B) {
	b.Run("repeat", func(b *testing.B) { benchSelectAndReserve(b, false) })
	// fresh changes the token right after the system prompt every time, so
	// each call books 5,187 blocks nobody holds (and the approximate index
	// grows by as much): run it with a bounded -benchtime such as 500x.
	b.Run("fresh", func(b *testing.B) { benchSelectAndReserve(b, true) })
}

// benchRouter is an approximate-mode router with workers workers of
// block size 16, closed when the benchmark ends.
func benchRouter(b *testing.B, workers int) *Router {
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	r, err := NewRouter(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.Close)
	for id := uint64(1); id <= uint64(workers); id++ {
		ep := "10.0.0.1:" + strconv.Itoa(int(8000+id))
		if _, err := r.Catalog().UpsertWorker(&WorkerRequest{WorkerID: ptr(id), Endpoint: &ep, BlockSize: ptr(uint32(16))}); err != nil {
			b.Fatal(err)
		}
	}
	return r
}

func benchSelectAndReserve(b *testing.B, fresh bool) {
	r := benchRouter(b, 1024)
	rng := rand.New(rand.NewPCG(1, 1))
	system := make([]uint32, 16_000)
	for i := range system {
		system[i] = uint32(rng.IntN(150000))
	}
	prompt := func(n int) []uint32 {
		t := append([]uint32(nil), system...)
		for len(t) < n {
			t = append(t, uint32(rng.IntN(150000)))
		}
		return t
	}
	// Warm the index: 64 workers served the system prompt; every worker
	// holds one earlier conversation of its own.
	for i := range 1024 {
		toks := prompt(4_000 + 16*i)
		if i >= 64 {
			toks = toks[16_000:]
		}
		res, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: toks}, Placement: Placement{PinnedWorker: &PinnedWorker{WorkerID: uint64(i + 1)}}})
		if err != nil {
			b.Fatal(err)
		}
		_ = r.Free(res.SelectionID)
	}
	// Live load: 256 requests decoding (prefill done); they share the system
	// prompt, so they land on its 64 holders.
	for i := range 256 {
		res, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: prompt(16_000 + 64*i)}})
		if err != nil {
			b.Fatal(err)
		}
		_ = r.PrefillComplete(res.SelectionID)
	}
	req := &SelectRequest{Prompt: Prompt{TokenIDs: prompt(99_000)}}
	// The 64 holders of the system prompt are busy decoding, so the cost
	// function may prefer an idle worker (and the answer's overlap is the
	// chosen worker's); the lookup must still find the shared prefix on
	// its holders.
	res, err := r.SelectAndReserveExplained(req)
	if err != nil {
		b.Fatal(err)
	}
	best := uint32(0)
	for _, c := range res.Candidates {
		best = max(best, c.DeviceBlocks)
	}
	if best < 16_000/16 {
		b.Fatalf("system prompt not matched: the best candidate holds %d blocks", best)
	}
	if err := r.Free(res.SelectionID); err != nil {
		b.Fatal(err)
	}
	req.SelectionID = ""
	b.ReportAllocs()
	n := uint32(0)
	for b.Loop() {
		if fresh {
			n++
			req.TokenIDs[16_000] = 150_000 + n
		}
		res, err := r.SelectAndReserve(req)
		if err != nil {
			b.Fatal(err)
		}
		req.SelectionID = ""
		if err := r.Free(res.SelectionID); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBlockHashes99k(b *testing.B) {
	tokens := make([]uint32, 99_000)
	for i := range tokens {
		tokens[i] = uint32(i * 7919 % 150000)
	}
	var blocks, seq []uint64
	b.SetBytes(int64(len(tokens) * 4))
	b.ReportAllocs()
	for b.Loop() {
		blocks = AppendBlockHashes(blocks[:0], tokens, 16, HashOptions{})
		seq = AppendSequenceHashes(seq[:0], blocks)
	}
}
