package selection

import (
	"maps"
	"slices"
)

// Catalog writes shared between replicas (docs/replicas.md): a worker
// registered, changed or removed through one replica's selection API is
// told to a CatalogSink, which shares it with the others; they apply it
// with UpsertWorker and DeleteWorker, which tell no sink, so an applied
// write is never shared again. Workers a gateway declares in its own
// config or discovers itself never reach the sink: they stay its own.

// CatalogSink hears the catalog writes made through the API. Its methods
// are called on the API's request path after the write committed: they
// must not block and must not call back into the catalog.
type CatalogSink interface {
	// WorkerWritten carries the registration that recreates the worker.
	WorkerWritten(reg *WorkerRequest)
	WorkerDeleted(id uint64)
}

// catalogOut is the catalog's link to its sink; the zero value has none.
type catalogOut struct{ sinkSlot[CatalogSink] }

// SetSink makes the catalog tell s about every API write from now on;
// nil stops it.
func (c *Catalog) SetSink(s CatalogSink) {
	c.shared.set(s)
}

// ClearSink stops telling s (and only s: a sink set since stays).
func (c *Catalog) ClearSink(s CatalogSink) {
	c.shared.clear(s)
}

// Shared tells the sink, if any, that the API wrote rec (the record the
// write returned).
func (c *Catalog) Shared(rec *WorkerRecord) {
	if sink := c.shared.get(); sink != nil {
		reg := rec.Registration()
		sink.WorkerWritten(&reg)
	}
}

// SharedDelete tells the sink, if any, that the API deleted worker id.
func (c *Catalog) SharedDelete(id uint64) {
	if sink := c.shared.get(); sink != nil {
		sink.WorkerDeleted(id)
	}
}

// Registration is the request an upsert recreates w from: every field it
// holds, except the facts its engine reported and its registration did
// not give (another gateway reads those from the engine itself).
func (w *WorkerRecord) Registration() WorkerRequest {
	id := w.WorkerID
	r := WorkerRequest{WorkerID: &id, RoutingGroup: valuePtr(w.RoutingGroup),
		Endpoint: clonePtr(w.Endpoint), KVEventsEndpoint: clonePtr(w.KVEventsEndpoint),
		KVEventsEndpoints: maps.Clone(w.KVEventsEndpoints), ReplayEndpoint: clonePtr(w.ReplayEndpoint),
		DataParallelStartRank: valuePtr(w.DataParallelStartRank), DataParallelSize: valuePtr(w.DataParallelSize),
		MaxNumBatchedTokens: clonePtr(w.MaxNumBatchedTokens), StableRoutingID: clonePtr(w.StableRoutingID),
		IsEagle: clonePtr(w.IsEagle), Taints: slices.Clone(w.Taints), TopologyDomains: maps.Clone(w.TopologyDomains),
		KVTransferDomain: clonePtr(w.KVTransferDomain), KVTransferEnforcement: clonePtr(w.KVTransferEnforcement),
		KVTransferPreferredWeight: clonePtr(w.KVTransferPreferredWeight), RouterHintWorkerType: clonePtr(w.RouterHintWorkerType),
		RouterHintSourceControl: maps.Clone(w.RouterHintSourceControl)}
	if w.given&factModel != 0 {
		r.ModelName = valuePtr(w.ModelName)
	}
	if w.given&factBlockSize != 0 {
		r.BlockSize = clonePtr(w.BlockSize)
	}
	if w.given&factTotalKVBlocks != 0 {
		r.TotalKVBlocks = clonePtr(w.TotalKVBlocks)
	}
	if w.given&factMaxModelLen != 0 {
		r.MaxModelLen = clonePtr(w.MaxModelLen)
	}
	if w.given&factLoraAdapters != 0 {
		r.LoraAdapters = slices.Clone(w.LoraAdapters)
	}
	if w.given&factEngineBlockSize != 0 {
		r.EngineBlockSize = clonePtr(w.EngineBlockSize)
	}
	return r
}

func valuePtr[T any](v T) *T { return &v }

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
