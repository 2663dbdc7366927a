package selection

import (
	"fmt"
	"slices"
	"strconv"
)

// Engine facts (docs/engine-facts.md): what a worker's engine says about
// itself, read by the gateway from the engine's own endpoints. They fill
// in what a registration left out (a worker may be declared by its
// endpoints alone), and they reveal a registration that disagrees with
// the engine: a block size the engine does not run with would make every
// cached prefix the router predicts a wrong one.

// EngineFacts is one reading of a worker's engine. A zero or nil field is
// unknown (the engine did not say), and leaves the record's value alone.
type EngineFacts struct {
	// Models are the base models the engine serves, its primary one first.
	Models []string
	// BlockSize is the engine's KV block size, in tokens.
	BlockSize uint32
	// TotalKVBlocks is the number of KV blocks the engine holds on device.
	TotalKVBlocks uint64
	// MaxModelLen is the engine's context length, in tokens.
	MaxModelLen uint64
	// LoraAdapters are the LoRA adapters the engine serves; empty but not
	// nil when it serves none.
	LoraAdapters []string
	// PrefixCaching is whether the engine caches prompt prefixes (vLLM's
	// --enable-prefix-caching, on by default); nil when it did not say.
	PrefixCaching *bool
}

// MaxLoraAdapters bounds the LoRA adapters of one worker. Each is one of
// the worker's taints, which an adapter request's constraint is matched
// against on every candidate, so they must stay a bounded handful.
const MaxLoraAdapters = 256

// factFields is a set of the record fields an engine reports.
type factFields uint8

const (
	factModel factFields = 1 << iota
	factBlockSize
	factTotalKVBlocks
	factMaxModelLen
	factLoraAdapters
	factEngineBlockSize
)

// factFields are the fields of req that an engine also reports.
func (req *WorkerRequest) factFields() factFields {
	var f factFields
	for _, x := range []struct {
		set   bool
		field factFields
	}{
		{req.ModelName != nil, factModel},
		{req.BlockSize != nil, factBlockSize},
		{req.TotalKVBlocks != nil, factTotalKVBlocks},
		{req.MaxModelLen != nil, factMaxModelLen},
		{req.LoraAdapters != nil, factLoraAdapters},
		{req.EngineBlockSize != nil, factEngineBlockSize},
	} {
		if x.set {
			f |= x.field
		}
	}
	return f
}

// applyFacts sets the record's fields that its registration did not give
// from f, where f knows them. With shape false it leaves the model and
// block size alone: the fields that place the worker in a partition.
func (w *WorkerRecord) applyFacts(f *EngineFacts, shape bool) {
	free := func(x factFields) bool { return w.given&x == 0 }
	if shape && free(factModel) && len(f.Models) > 0 && !slices.Contains(f.Models, w.ModelName) {
		w.ModelName = f.Models[0]
	}
	if shape && free(factEngineBlockSize) && f.BlockSize > 0 {
		v := f.BlockSize
		w.EngineBlockSize = &v
	}
	if shape && free(factBlockSize) && f.BlockSize > 0 {
		v := f.BlockSize
		w.BlockSize = &v
	}
	if free(factTotalKVBlocks) && f.TotalKVBlocks > 0 {
		v := f.TotalKVBlocks
		w.TotalKVBlocks = &v
	}
	if free(factMaxModelLen) && f.MaxModelLen > 0 {
		v := f.MaxModelLen
		w.MaxModelLen = &v
	}
	if free(factLoraAdapters) && f.LoraAdapters != nil {
		w.LoraAdapters = normalAdapters(f.LoraAdapters)
	}
	if f.PrefixCaching != nil {
		w.EnginePrefixCaching = clonePtr(f.PrefixCaching)
	}
}

// carryFacts gives a re-registered worker (w, from an upsert) what its
// engine reported to the record it replaces, old, for the fields neither
// registration gave: an upsert of the same server (a config reload
// declares its workers again) must not undo the engine's facts until the
// next reading.
func (w *WorkerRecord) carryFacts(old *WorkerRecord) {
	from := func(x factFields) bool { return w.given&x == 0 && old.given&x == 0 }
	if from(factModel) {
		w.ModelName = old.ModelName
	}
	if from(factBlockSize) && old.BlockSize != nil {
		v := *old.BlockSize
		w.BlockSize = &v
	}
	if from(factEngineBlockSize) && old.EngineBlockSize != nil {
		v := *old.EngineBlockSize
		w.EngineBlockSize = &v
	}
	if from(factTotalKVBlocks) && old.TotalKVBlocks != nil {
		v := *old.TotalKVBlocks
		w.TotalKVBlocks = &v
	}
	if from(factMaxModelLen) && old.MaxModelLen != nil {
		v := *old.MaxModelLen
		w.MaxModelLen = &v
	}
	if from(factLoraAdapters) {
		w.LoraAdapters = slices.Clone(old.LoraAdapters)
	}
	w.EnginePrefixCaching = clonePtr(old.EnginePrefixCaching) // only an engine says it
}

// sameFacts reports whether a and b agree on every field an engine
// reports, so that a reading that changes nothing writes nothing.
func sameFacts(a, b *WorkerRecord) bool {
	return a.ModelName == b.ModelName && samePtr(a.BlockSize, b.BlockSize) && samePtr(a.EngineBlockSize, b.EngineBlockSize) &&
		samePtr(a.TotalKVBlocks, b.TotalKVBlocks) && samePtr(a.MaxModelLen, b.MaxModelLen) &&
		slices.Equal(a.LoraAdapters, b.LoraAdapters) && samePtr(a.EnginePrefixCaching, b.EnginePrefixCaching)
}

// samePtr reports whether x and y are both nil or point to equal values.
func samePtr[T comparable](x, y *T) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }

// loadOnly reports whether the worker's cached prefixes must not be
// credited: its engine runs another block size than the one the router
// hashes its prompts with, so what the index holds for it (or the
// router's own guess) names other blocks than the engine caches; or its
// engine caches no prefixes at all, so what the approximate index would
// take as cached there never is.
func (w *WorkerRecord) loadOnly() bool {
	return w.otherBlockSize() || w.noPrefixCaching()
}

func (w *WorkerRecord) otherBlockSize() bool {
	return w.BlockSize != nil && w.EngineBlockSize != nil && *w.BlockSize != *w.EngineBlockSize
}

func (w *WorkerRecord) noPrefixCaching() bool {
	return w.EnginePrefixCaching != nil && !*w.EnginePrefixCaching
}

// loadOnlyReasons are the record's LoadOnlyReasons.
func (w *WorkerRecord) loadOnlyReasons() []string {
	var out []string
	if w.otherBlockSize() {
		out = append(out, fmt.Sprintf("engine_block_size %d differs from block_size %d: routed by load only, its cached prefixes not credited",
			*w.EngineBlockSize, *w.BlockSize))
	}
	if w.noPrefixCaching() {
		out = append(out, "the engine runs with prefix caching off: routed by load only, nothing it is sent counted as cached")
	}
	return out
}

// normalAdapters is a set of adapter names, sorted, without repeats or
// empty names: the order an engine lists them in means nothing, and
// comparing two readings must not see a change where there is none.
func normalAdapters(names []string) []string {
	out := slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == "" })
	slices.Sort(out)
	return slices.Compact(out)
}

// checkAdapterBounds refuses more adapters than MaxLoraAdapters, or a
// name past MaxFieldBytes, as checkBounds does the other fields.
func (w *WorkerRecord) checkAdapterBounds() error {
	if len(w.LoraAdapters) > MaxLoraAdapters {
		return errorf(KindUnprocessable, "lora_adapters has %d entries, more than the bound of %d", len(w.LoraAdapters), MaxLoraAdapters)
	}
	for i, a := range w.LoraAdapters {
		if len(a) > MaxFieldBytes {
			return tooLong("lora_adapters["+strconv.Itoa(i)+"]", len(a), MaxFieldBytes)
		}
	}
	return nil
}

// ApplyEngineFacts writes what worker id's engine, read at endpoint,
// reports: the fields its registration did not give take the engine's
// values (a worker declared by its endpoints alone gets its model and
// block size), and engine_block_size records the engine's block size
// whatever the registration said; a worker whose block size differs from
// its engine's is routed by load only (WorkerRecord.LoadOnlyReasons).
//
// It is a catalog write like PatchWorker, with its checks and hooks, made
// only when something changed, and never for a worker whose endpoint is
// no longer endpoint (the reading was of a server it has left). When the
// engine's model or block size would conflict with the worker's
// partition, or break a bound, the rest is still applied, without them,
// and the error says what was refused. It returns the record after the
// write and whether it changed.
func (c *Catalog) ApplyEngineFacts(id uint64, endpoint string, f *EngineFacts) (WorkerRecord, bool, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.RLock()
	old := c.workers[id]
	c.mu.RUnlock()
	if old == nil {
		return WorkerRecord{}, false, errorf(KindNotFound, "worker %d not found", id)
	}
	if endpointOf(old) != endpoint {
		return old.clone(), false, errorf(KindConflict, "worker %d moved from %s to %s while its engine was read", id, endpoint, endpointOf(old))
	}
	var refused error
	for _, shape := range []bool{true, false} {
		rec := old.clone()
		rec.applyFacts(f, shape)
		if sameFacts(&rec, old) {
			return old.clone(), false, refused
		}
		if err := rec.prepare(c.cfg.get()); err != nil {
			refused = err
			continue
		}
		// The endpoint is old's, so there is nothing to check.
		out, err := c.commitWorkerLocked(&rec, false, endpoint)
		if err == nil {
			return out, true, refused
		}
		refused = err
	}
	return old.clone(), false, refused
}
