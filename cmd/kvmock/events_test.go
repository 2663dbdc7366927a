package main

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/indexer"
)

// checkStored checks that ev is a BlockStored of the full blocks of
// tokens[from:to] (in blocks of bs) with the chained hashes and the given
// parent.
func checkStored(t *testing.T, ev indexer.Event, tokens []uint32, bs, from, to int) {
	t.Helper()
	hashes := blockHashes(tokens, bs, "", "")
	if ev.Kind != indexer.Stored || ev.BlockSize != bs || ev.Tier != indexer.Device || ev.Skip {
		t.Fatalf("event %+v, want a GPU BlockStored of block size %d", ev, bs)
	}
	if !slices.Equal(ev.BlockHashes, hashes[from:to]) {
		t.Fatalf("block_hashes %v, want %v", ev.BlockHashes, hashes[from:to])
	}
	if !slices.Equal(ev.TokenIDs, tokens[from*bs:to*bs]) {
		t.Fatalf("token_ids %v, want %v", ev.TokenIDs, tokens[from*bs:to*bs])
	}
	if from == 0 && ev.HasParent {
		t.Fatalf("first block has parent %x", ev.ParentHash)
	}
	if from > 0 && (!ev.HasParent || ev.ParentHash != hashes[from-1]) {
		t.Fatalf("parent %x (set %v), want %x", ev.ParentHash, ev.HasParent, hashes[from-1])
	}
}

func TestStoredEventsDescribeTheBlocks(t *testing.T) {
	for _, enc := range []indexer.Encoding{indexer.EncodingMap, indexer.EncodingArray} {
		f := newTestFleet(t, func(c *Config) { c.Encoding = enc })
		z := newZMQClient(t)
		sub := z.subscribe(f, f.workers[0].engines[0].pub)

		p1 := tokenRange(1, 40) // two full blocks and a partial one
		complete(t, f, 1, p1, 1)
		seq, payload := recv(t, sub)
		b := decode(t, payload)
		if seq != 0 || b.dpRank != 0 || len(b.events) != 1 {
			t.Fatalf("seq %d, batch %+v", seq, b)
		}
		checkStored(t, b.events[0], p1, 16, 0, 2)

		// The same two blocks plus 20 tokens: one new block, whose parent is
		// the second block of the first request.
		p2 := append(slices.Clone(p1[:32]), tokenRange(500, 20)...)
		complete(t, f, 1, p2, 1)
		seq, payload = recv(t, sub)
		b = decode(t, payload)
		if seq != 1 || len(b.events) != 1 {
			t.Fatalf("seq %d, batch %+v", seq, b)
		}
		checkStored(t, b.events[0], p2, 16, 2, 3)
		expectNothing(t, sub, 50*time.Millisecond)
	}
}

func TestChunkedPrefillPublishesEachChunk(t *testing.T) {
	f := newTestFleet(t, func(c *Config) { c.MaxBatchedTokens = 16 })
	z := newZMQClient(t)
	sub := z.subscribe(f, f.workers[0].engines[0].pub)
	p := tokenRange(7, 48)
	complete(t, f, 1, p, 1)
	// One step per block, one batch per step, each linked to the last.
	for i := range 3 {
		seq, payload := recv(t, sub)
		b := decode(t, payload)
		if seq != uint64(i) || len(b.events) != 1 {
			t.Fatalf("seq %d, batch %+v", seq, b)
		}
		checkStored(t, b.events[0], p, 16, i, i+1)
	}
}

func TestEvictionPublishesBlockRemoved(t *testing.T) {
	f := newTestFleet(t, func(c *Config) { c.KVBlocks, c.BlockSize = 8, 4 })
	z := newZMQClient(t)
	sub := z.subscribe(f, f.workers[0].engines[0].pub)
	a, b, c := tokenRange(1, 12), tokenRange(101, 12), tokenRange(201, 12)

	// Each request needs four blocks (three prompt blocks and one for its
	// output), so two fit beside each other and the third must evict.
	complete(t, f, 1, a, 1)
	complete(t, f, 1, b, 1)
	for range 2 {
		_, payload := recv(t, sub)
		if d := decode(t, payload); len(d.events) != 1 || d.events[0].Kind != indexer.Stored {
			t.Fatalf("batch %+v", d)
		}
	}
	complete(t, f, 1, c, 1)
	seq, payload := recv(t, sub)
	d := decode(t, payload)
	if seq != 2 || len(d.events) != 4 {
		t.Fatalf("seq %d, batch %+v", seq, d)
	}
	// The least recently freed blocks go first, and a request's blocks are
	// freed tail first, so A's blocks are evicted from its last to its first.
	ha := blockHashes(a, 4, "", "")
	for i, want := range []uint64{ha[2], ha[1], ha[0]} {
		ev := d.events[i]
		if ev.Kind != indexer.Removed || !slices.Equal(ev.BlockHashes, []uint64{want}) || ev.Tier != indexer.Device {
			t.Fatalf("event %d = %+v, want BlockRemoved %x", i, ev, want)
		}
	}
	checkStored(t, d.events[3], c, 4, 0, 3)

	// B's blocks survived (a prompt's last block is always recomputed, so
	// two of its three blocks hit); A's are gone.
	if got, _ := complete(t, f, 1, b, 1); got.Usage.PromptTokensDetails.CachedTokens != 8 {
		t.Fatalf("b: %+v", *got.Usage)
	}
	if got, _ := complete(t, f, 1, a, 1); got.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("evicted prefix still hit: %+v", *got.Usage)
	}
	if n := f.stats().Workers[0].Evictions; n < 3 {
		t.Fatalf("stats evictions = %d", n)
	}
}

func TestReplayAnswersADealer(t *testing.T) {
	f := newTestFleet(t, nil)
	z := newZMQClient(t)
	for i := range 3 {
		complete(t, f, 1, tokenRange(1000*i, 20), 1)
	}
	ep := f.workers[0].engines[0].pub.ReplayEndpoint
	seqs, payloads := z.replay(ep, 0)
	if !slices.Equal(seqs, []uint64{0, 1, 2}) {
		t.Fatalf("replayed seqs %v", seqs)
	}
	for i, p := range payloads {
		checkStored(t, decode(t, p).events[0], tokenRange(1000*i, 20), 16, 0, 1)
	}
	if seqs, _ := z.replay(ep, 2); !slices.Equal(seqs, []uint64{2}) {
		t.Fatalf("replay from 2: %v", seqs)
	}
	if seqs, _ := z.replay(ep, 3); len(seqs) != 0 {
		t.Fatalf("replay from 3: %v", seqs)
	}

	// A malformed request (no empty delimiter, as AIBrix sends) gets no
	// answer, and the server keeps working.
	d := z.socket(zmq.DEALER, ep)
	_, _ = d.SendBytes([]byte{0, 0, 0, 0, 0, 0, 0, 0}, 0)
	_ = d.SetRcvtimeo(100 * time.Millisecond)
	if f, err := d.RecvMessageBytes(0); err == nil {
		t.Fatalf("answer to a malformed request: %q", f)
	}
	if seqs, _ := z.replay(ep, 1); !slices.Equal(seqs, []uint64{1, 2}) {
		t.Fatalf("replay from 1: %v", seqs)
	}
}

func TestReplayBufferKeepsTheLastBatches(t *testing.T) {
	f := newTestFleet(t, func(c *Config) { c.ReplayBuffer = 3 })
	z := newZMQClient(t)
	for i := range 5 {
		complete(t, f, 1, tokenRange(1000*i, 16), 1)
	}
	if seqs, _ := z.replay(f.workers[0].engines[0].pub.ReplayEndpoint, 0); !slices.Equal(seqs, []uint64{2, 3, 4}) {
		t.Fatalf("replayed %v", seqs)
	}
}

func TestDropEventsLeavesAGapThatReplayFills(t *testing.T) {
	f := newTestFleet(t, nil)
	z := newZMQClient(t)
	pub := f.workers[0].engines[0].pub
	sub := z.subscribe(f, pub)
	prompts := [][]uint32{tokenRange(1, 16), tokenRange(100, 16), tokenRange(200, 16), tokenRange(300, 16)}

	complete(t, f, 1, prompts[0], 1)
	if seq, _ := recv(t, sub); seq != 0 {
		t.Fatalf("seq %d", seq)
	}
	admin(t, f, "/workers/1/drop_events?n=2")
	complete(t, f, 1, prompts[1], 1)
	complete(t, f, 1, prompts[2], 1)
	complete(t, f, 1, prompts[3], 1)
	seq, _ := recv(t, sub)
	if seq != 3 {
		t.Fatalf("after dropping two batches the next seq is %d, want 3", seq)
	}
	seqs, payloads := z.replay(pub.ReplayEndpoint, 1)
	if !slices.Equal(seqs, []uint64{1, 2, 3}) {
		t.Fatalf("replay from 1: %v", seqs)
	}
	for i, p := range payloads {
		checkStored(t, decode(t, p).events[0], prompts[i+1], 16, 0, 1)
	}
	if s := f.stats().Workers[0]; s.BatchesDropped != 2 || s.BatchesPublished != 2 || s.NextSeq != 4 {
		t.Fatalf("stats %+v", s.rankStats)
	}
}

func TestRestartResetsTheSequence(t *testing.T) {
	f := newTestFleet(t, nil)
	z := newZMQClient(t)
	pub := f.workers[0].engines[0].pub
	sub := z.subscribe(f, pub)
	p := tokenRange(1, 32)
	complete(t, f, 1, p, 1)
	complete(t, f, 1, tokenRange(100, 32), 1)
	for want := range uint64(2) {
		if seq, _ := recv(t, sub); seq != want {
			t.Fatalf("seq %d, want %d", seq, want)
		}
	}

	admin(t, f, "/workers/1/restart")
	// A restart announces nothing: no AllBlocksCleared.
	expectNothing(t, sub, 100*time.Millisecond)
	got, _ := complete(t, f, 1, p, 1)
	if got.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("cache survived the restart: %+v", *got.Usage)
	}
	seq, payload := recv(t, sub)
	if seq != 0 {
		t.Fatalf("first seq after the restart is %d, want 0", seq)
	}
	checkStored(t, decode(t, payload).events[0], p, 16, 0, 2)
	// The replay buffer starts empty too.
	if seqs, _ := z.replay(pub.ReplayEndpoint, 0); !slices.Equal(seqs, []uint64{0}) {
		t.Fatalf("replay after restart: %v", seqs)
	}
}

func TestRestartFailsRequestsInFlight(t *testing.T) {
	f := newTestFleet(t, func(c *Config) { c.DecodeTime = 10 * time.Millisecond })
	res, err := http.Post(f.url(1)+"/v1/completions", "application/json",
		strings.NewReader(mustJSON(t, map[string]any{"prompt": tokenRange(1, 16), "max_tokens": 1000, "stream": true})))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	buf := make([]byte, 1)
	if _, err := res.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	admin(t, f, "/workers/1/restart")
	// Like a dead process: the stream breaks instead of ending with [DONE].
	readSSEErr := func() error {
		b := make([]byte, 4096)
		var all []byte
		for {
			n, err := res.Body.Read(b)
			all = append(all, b[:n]...)
			if err != nil {
				if strings.Contains(string(all), "[DONE]") {
					return nil
				}
				return err
			}
		}
	}
	if err := readSSEErr(); err == nil {
		t.Fatal("stream ended normally across a restart")
	}
	if s := f.stats().Workers[0]; s.Running != 0 || s.KVCacheUsage != 0 {
		t.Fatalf("after restart: %+v", s.rankStats)
	}
}

func TestResetClearsEveryCache(t *testing.T) {
	f := newTestFleet(t, nil)
	z := newZMQClient(t)
	subs := []*zmq.Socket{
		z.subscribe(f, f.workers[0].engines[0].pub),
		z.subscribe(f, f.workers[1].engines[0].pub),
	}
	p := tokenRange(1, 32)
	complete(t, f, 1, p, 1)
	recv(t, subs[0])
	admin(t, f, "/reset")
	for i, sub := range subs {
		seq, payload := recv(t, sub)
		d := decode(t, payload)
		if len(d.events) != 1 || d.events[0].Kind != indexer.Cleared {
			t.Fatalf("worker %d: %+v", i+1, d)
		}
		if want := uint64(1 - i); seq != want {
			t.Fatalf("worker %d: seq %d, want %d (a reset is no restart)", i+1, seq, want)
		}
	}
	if got, _ := complete(t, f, 1, p, 1); got.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("cache survived /reset: %+v", *got.Usage)
	}
}

func TestDataParallelRanks(t *testing.T) {
	f := newTestFleet(t, func(c *Config) { c.Workers, c.DPRanks = 1, 2 })
	w := f.workers[0]
	if w.engines[0].pub.PubEndpoint == w.engines[1].pub.PubEndpoint {
		t.Fatal("ranks share a PUB endpoint")
	}
	z := newZMQClient(t)
	sub0 := z.subscribe(f, w.engines[0].pub)
	sub1 := z.subscribe(f, w.engines[1].pub)
	p := tokenRange(1, 32)
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, f.url(1)+"/v1/completions",
			strings.NewReader(mustJSON(t, map[string]any{"prompt": p, "max_tokens": 1})))
		req.Header.Set("X-Data-Parallel-Rank", "1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.Header.Get("X-Kvmock-Dp-Rank") != "1" {
			t.Fatalf("served by rank %q", res.Header.Get("X-Kvmock-Dp-Rank"))
		}
	}
	seq, payload := recv(t, sub1)
	if d := decode(t, payload); seq != 0 || d.dpRank != 1 {
		t.Fatalf("rank 1: seq %d, dp_rank %d", seq, d.dpRank)
	}
	expectNothing(t, sub0, 50*time.Millisecond)
	// Rank 0 has its own, empty cache.
	req, _ := http.NewRequest(http.MethodPost, f.url(1)+"/v1/completions",
		strings.NewReader(mustJSON(t, map[string]any{"prompt": p, "max_tokens": 1})))
	req.Header.Set("X-Data-Parallel-Rank", "0")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.Header.Get("X-Kvmock-Cached-Tokens") != "0" {
		t.Fatalf("rank 0 cached %s tokens", res.Header.Get("X-Kvmock-Cached-Tokens"))
	}
	if s := f.stats().Workers[0]; len(s.Ranks) != 2 || s.Ranks[1].CachedTokens != 16 || s.CachedTokens != 16 {
		t.Fatalf("stats %+v", s)
	}
}
