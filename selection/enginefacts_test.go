package selection

import (
	"slices"
	"strings"
	"testing"
)

// llamaFacts is an engine serving llama with two adapters.
func llamaFacts() *EngineFacts {
	return &EngineFacts{Models: []string{"llama"}, BlockSize: 16, TotalKVBlocks: 1000, MaxModelLen: 8192,
		LoraAdapters: []string{"sql", "chat", "sql", ""}}
}

// TestEngineFactsFillWhatTheRegistrationLeftOut: a worker registered by
// its endpoint alone waits, incomplete, for its block size; the engine's
// reading gives it its model, block size and capacities, once.
func TestEngineFactsFillWhatTheRegistrationLeftOut(t *testing.T) {
	r := newTestRouter(t, nil)
	c := r.Catalog()
	rec, err := c.UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(1)), Endpoint: ptr("a:1")})
	if err != nil || rec.Schedulable() || rec.ModelName != "default" {
		t.Fatalf("endpoint-only worker: %+v %v", rec, err)
	}
	rec, changed, err := c.ApplyEngineFacts(1, "a:1", llamaFacts())
	if err != nil || !changed {
		t.Fatalf("apply: changed %v, %v", changed, err)
	}
	if !rec.Schedulable() || rec.ModelName != "llama" || *rec.BlockSize != 16 || *rec.EngineBlockSize != 16 ||
		*rec.TotalKVBlocks != 1000 || *rec.MaxModelLen != 8192 || !slices.Equal(rec.LoraAdapters, []string{"chat", "sql"}) ||
		len(rec.LoadOnlyReasons) != 0 {
		t.Fatalf("record after the facts: %+v", rec)
	}
	if _, changed, err := c.ApplyEngineFacts(1, "a:1", llamaFacts()); changed || err != nil {
		t.Fatalf("the same reading again: changed %v, %v", changed, err)
	}
	res, err := r.Select(&SelectRequest{Partition: Partition{ModelName: "llama"}, Prompt: Prompt{TokenIDs: []uint32{1, 2}}})
	if err != nil || res.WorkerID != 1 || res.BlockSize != 16 {
		t.Fatalf("select llama: %+v %v", res, err)
	}
	// A reading of the server the worker has left is not applied.
	if _, err := c.PatchWorker(1, &WorkerRequest{Endpoint: ptr("b:1")}); err != nil {
		t.Fatal(err)
	}
	f := llamaFacts()
	f.MaxModelLen = 4096
	_, changed, err = c.ApplyEngineFacts(1, "a:1", f)
	mustStatus(t, err, 409, "moved from a:1 to b:1")
	if changed {
		t.Fatal("a stale reading changed the record")
	}
}

// TestEngineFactsNeverOverrideTheRegistration: what a registration gave
// stays; a block size the engine does not run with makes the worker
// load-only, with its reason; the catalog's default block size counts as
// given.
func TestEngineFactsNeverOverrideTheRegistration(t *testing.T) {
	r := newTestRouter(t, func(c *Config) { c.DefaultBlockSize = 4 })
	c := r.Catalog()
	addWorker(t, r, 1, func(w *WorkerRequest) {
		w.ModelName, w.TotalKVBlocks, w.LoraAdapters = ptr("m"), ptr(uint64(5)), []string{"mine"}
	})
	rec, changed, err := c.ApplyEngineFacts(1, "127.0.0.1:9", llamaFacts())
	if err != nil || !changed {
		t.Fatalf("apply: %v %v", changed, err)
	}
	if rec.ModelName != "m" || *rec.BlockSize != 16 || *rec.EngineBlockSize != 16 || *rec.TotalKVBlocks != 5 ||
		!slices.Equal(rec.LoraAdapters, []string{"mine"}) || *rec.MaxModelLen != 8192 || len(rec.LoadOnlyReasons) != 0 {
		t.Fatalf("given fields were overridden: %+v", rec)
	}
	// The default block size (4) is not the engine's (16).
	if _, err := c.UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(2)), Endpoint: ptr("b:1"), ModelName: ptr("n")}); err != nil {
		t.Fatal(err)
	}
	rec, _, err = c.ApplyEngineFacts(2, "b:1", llamaFacts())
	if err != nil || !rec.Schedulable() || *rec.BlockSize != 4 || *rec.EngineBlockSize != 16 || len(rec.LoadOnlyReasons) != 1 ||
		rec.LoadOnlyReasons[0] != "engine_block_size 16 differs from block_size 4: routed by load only, its cached prefixes not credited" {
		t.Fatalf("default block size against the engine's: %+v %v", rec, err)
	}
	// The registration can set the extension fields itself.
	rec = addWorker(t, r, 3, func(w *WorkerRequest) {
		w.EngineBlockSize, w.MaxModelLen, w.LoraAdapters = ptr(uint32(16)), ptr(uint64(100)), []string{"b", "a"}
	})
	if *rec.EngineBlockSize != 16 || *rec.MaxModelLen != 100 || !slices.Equal(rec.LoraAdapters, []string{"a", "b"}) || len(rec.LoadOnlyReasons) != 0 {
		t.Fatalf("registered extension fields: %+v", rec)
	}
}

// TestEngineFactsSurviveAReupsertOfTheSameServer: a config reload upserts
// its workers again; the engine's facts stay until the server changes.
func TestEngineFactsSurviveAReupsertOfTheSameServer(t *testing.T) {
	r := newTestRouter(t, nil)
	c := r.Catalog()
	req := &WorkerRequest{WorkerID: ptr(uint64(1)), Endpoint: ptr("a:1")}
	if _, err := c.UpsertWorker(req); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.ApplyEngineFacts(1, "a:1", llamaFacts()); err != nil {
		t.Fatal(err)
	}
	rec, err := c.UpsertWorker(req)
	if err != nil || rec.ModelName != "llama" || !rec.Schedulable() || *rec.MaxModelLen != 8192 || len(rec.LoraAdapters) != 2 {
		t.Fatalf("re-upserted: %+v %v", rec, err)
	}
	// What the new registration gives wins.
	rec, err = c.UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(1)), Endpoint: ptr("a:1"), ModelName: ptr("other")})
	if err != nil || rec.ModelName != "other" || *rec.BlockSize != 16 {
		t.Fatalf("re-upserted with a model: %+v %v", rec, err)
	}
	// Another server knows nothing of the old one's engine.
	rec, err = c.UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(1)), Endpoint: ptr("b:1")})
	if err != nil || rec.ModelName != "default" || rec.BlockSize != nil || rec.MaxModelLen != nil || rec.LoraAdapters != nil {
		t.Fatalf("another server: %+v %v", rec, err)
	}
}

// TestEngineFactsThatConflictLeaveThePartitionAlone: an engine block size
// that the worker's partition does not share is refused, and the other
// facts are still applied; a later write to the worker is not refused
// for it.
func TestEngineFactsThatConflictLeaveThePartitionAlone(t *testing.T) {
	r := newTestRouter(t, nil)
	c := r.Catalog()
	addWorker(t, r, 1, func(w *WorkerRequest) { w.ModelName = ptr("llama") })
	if _, err := c.UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(2)), Endpoint: ptr("b:1"), ModelName: ptr("llama")}); err != nil {
		t.Fatal(err)
	}
	f := llamaFacts()
	f.BlockSize = 32
	rec, changed, err := c.ApplyEngineFacts(2, "b:1", f)
	mustStatus(t, err, 409, "block_size 32 conflicts with block_size 16")
	if !changed || rec.BlockSize != nil || rec.EngineBlockSize != nil || *rec.TotalKVBlocks != 1000 || rec.Schedulable() {
		t.Fatalf("after a refused block size: changed %v %+v", changed, rec)
	}
	if _, err := c.PatchWorker(2, &WorkerRequest{Taints: []string{"t"}}); err != nil {
		t.Fatalf("a patch after refused facts: %v", err)
	}
	// Adapters past the bound are refused like any field past its bound.
	many := make([]string, MaxLoraAdapters+1)
	for i := range many {
		many[i] = string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	_, err = c.UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(3)), Endpoint: ptr("c:1"), LoraAdapters: many})
	mustStatus(t, err, 422, "lora_adapters has 257 entries")
}

// bothHoldingRouter is a router whose index says workers 1 and 2 (block
// size 4) both hold a 16-token prompt's 4 blocks; second changes worker
// 2's registration.
func bothHoldingRouter(t *testing.T, second func(*WorkerRequest)) *Router {
	t.Helper()
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	idx := fixedIndex{{WorkerID: 1}: {Device: 4}, {WorkerID: 2}: {Device: 4}}
	r, err := NewRouter(cfg, WithIndexer(idx))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	addWorker(t, r, 1, func(w *WorkerRequest) { w.BlockSize = ptr(uint32(4)) })
	addWorker(t, r, 2, func(w *WorkerRequest) {
		w.BlockSize = ptr(uint32(4))
		if second != nil {
			second(w)
		}
	})
	return r
}

// TestLoadOnlyWorkerIsNotCreditedForItsCache: both workers hold the
// prompt's blocks by the index; the one whose engine runs another block
// size scores as if it held nothing, in selections and in the scores.
func TestLoadOnlyWorkerIsNotCreditedForItsCache(t *testing.T) {
	r := bothHoldingRouter(t, func(w *WorkerRequest) { w.EngineBlockSize = ptr(uint32(16)) })
	prompt := Prompt{TokenIDs: make([]uint32, 16)}
	scores, err := r.Queries().OverlapScores(&ScoreRequest{Prompt: prompt})
	if err != nil || scores.Workers[0].DeviceBlocks != 4 || scores.Workers[1].DeviceBlocks != 0 {
		t.Fatalf("overlap scores: %+v %v", scores, err)
	}
	res, err := r.Select(&SelectRequest{Prompt: prompt})
	if err != nil || res.WorkerID != 1 || res.CachedTokens != 16 {
		t.Fatalf("select: %+v %v", res, err)
	}
	res, err = r.Select(&SelectRequest{Prompt: prompt, Placement: Placement{AllowedWorkerIDs: []uint64{2}}})
	if err != nil || res.WorkerID != 2 || res.CachedTokens != 0 || res.EffectivePrefillTokens != 16 {
		t.Fatalf("select the load-only worker: %+v %v", res, err)
	}
	// Once the block sizes agree, its cache counts again.
	if _, err := r.Catalog().PatchWorker(2, &WorkerRequest{EngineBlockSize: ptr(uint32(4))}); err != nil {
		t.Fatal(err)
	}
	res, err = r.Select(&SelectRequest{Prompt: prompt, Placement: Placement{AllowedWorkerIDs: []uint64{2}}})
	if err != nil || res.CachedTokens != 16 {
		t.Fatalf("select after the fix: %+v %v", res, err)
	}
}

// An engine block size of 0 is refused: no engine runs with it.
func TestEngineBlockSizeZeroRefused(t *testing.T) {
	r := newTestRouter(t, nil)
	_, err := r.Catalog().UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(1)), Endpoint: ptr("127.0.0.1:9"), EngineBlockSize: ptr(uint32(0))})
	if StatusOf(err) != 422 {
		t.Fatalf("engine_block_size 0: %v", err)
	}
}

// TestPrefixCachingOffIsLoadOnly: an engine that reports prefix caching
// off caches nothing a request is sent, so the worker is routed by load:
// its record says why, and neither the index's entries nor the
// approximate index's records for it are credited. An engine that turns
// it back on is credited again; a re-registration keeps the engine's word.
func TestPrefixCachingOffIsLoadOnly(t *testing.T) {
	r := bothHoldingRouter(t, nil)
	off, on := false, true
	rec, changed, err := r.Catalog().ApplyEngineFacts(2, "127.0.0.1:9", &EngineFacts{PrefixCaching: &off})
	if err != nil || !changed || len(rec.LoadOnlyReasons) != 1 || !strings.Contains(rec.LoadOnlyReasons[0], "prefix caching off") {
		t.Fatalf("engine facts: %+v changed %v err %v", rec.LoadOnlyReasons, changed, err)
	}
	prompt := Prompt{TokenIDs: make([]uint32, 16)}
	res, err := r.Select(&SelectRequest{Prompt: prompt, Placement: Placement{AllowedWorkerIDs: []uint64{2}}})
	if err != nil || res.CachedTokens != 0 {
		t.Fatalf("select the worker without prefix caching: %+v %v", res, err)
	}
	// A re-registration (a reload declaring it again) keeps what the engine said.
	addWorker(t, r, 2, func(w *WorkerRequest) { w.BlockSize = ptr(uint32(4)) })
	if rec, _ := r.Catalog().Worker(2); len(rec.LoadOnlyReasons) != 1 {
		t.Fatalf("after a re-registration: %+v", rec.LoadOnlyReasons)
	}
	if _, _, err := r.Catalog().ApplyEngineFacts(2, "127.0.0.1:9", &EngineFacts{PrefixCaching: &on}); err != nil {
		t.Fatal(err)
	}
	res, err = r.Select(&SelectRequest{Prompt: prompt, Placement: Placement{AllowedWorkerIDs: []uint64{2}}})
	if err != nil || res.CachedTokens != 16 {
		t.Fatalf("select after prefix caching was turned on: %+v %v", res, err)
	}
}
