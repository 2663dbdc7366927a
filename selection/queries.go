package selection

import "sort"

// Read-only queries over the partitions' loads and the index: GET /loads,
// POST /potential_loads and POST /overlap_scores (docs/selection-api.md).
// They book nothing.

// Queries answers the read-only questions about a router: its loads, the
// loads and overlaps a prompt would have, and the index dump. Scoring a
// prompt goes through the same setup as selecting it (selector).
type Queries struct {
	catalog *Catalog
	sel     *selector
	index   Indexer
	cfg     *liveConfig // its MaxDumpEvents bounds a dump
}

// Loads reports every rank's current load, per partition, sorted by
// (model, group); empty filters match everything.
func (q *Queries) Loads(model, group string) []ModelLoadResponse {
	parts := q.catalog.partitions(model, group)
	sort.Slice(parts, func(i, j int) bool {
		a, b := parts[i].key, parts[j].key
		return a.Model < b.Model || a.Model == b.Model && a.Group < b.Group
	})
	out := make([]ModelLoadResponse, 0, len(parts))
	for _, p := range parts {
		p.mu.Lock()
		loads := make([]PotentialLoad, len(p.ranks))
		for i, rs := range p.ranks {
			loads[i] = PotentialLoad{WorkerID: rs.rank.WorkerID, DPRank: rs.rank.DPRank,
				PotentialPrefillTokens: rs.prefillTokens, PotentialDecodeBlocks: rs.decodeBlocks(), ActiveRequests: rs.requests}
		}
		p.mu.Unlock()
		out = append(out, ModelLoadResponse{ModelName: p.key.Model, RoutingGroup: p.key.Group, Loads: loads})
	}
	return out
}

// scoreRequest runs the shared part of PotentialLoads and OverlapScores and
// calls fn with the partition locked and w filled.
func (q *Queries) scoreRequest(req *ScoreRequest, fn func(p *partition, w *work, s *scoring, np normPrompt)) error {
	su, err := q.sel.setupRequest(&req.Partition, req.RouterConfigOverride, &req.Prompt, "")
	if err != nil {
		return err
	}
	defer putWork(su.w)
	su.p.mu.Lock()
	defer su.p.mu.Unlock()
	su.p.scoreInputs(su.w)
	fn(su.p, su.w, &su.s, su.np)
	return nil
}

// PotentialLoads reports the load every rank would have with this prompt
// added (docs/selection-api.md, "Loads and scores").
func (q *Queries) PotentialLoads(req *ScoreRequest) ([]PotentialLoad, error) {
	var out []PotentialLoad
	err := q.scoreRequest(req, func(p *partition, w *work, s *scoring, np normPrompt) {
		out = make([]PotentialLoad, len(p.ranks))
		for i, rs := range p.ranks {
			prefill := rs.prefillTokens
			if s.trackPrefill {
				prefill += effectivePrefill(np.isl, s.cachedTokens(w.tiers[i], p.blockSize))
			}
			out[i] = PotentialLoad{WorkerID: rs.rank.WorkerID, DPRank: rs.rank.DPRank,
				PotentialPrefillTokens: prefill,
				PotentialDecodeBlocks:  rs.decodeBlocks() + uint64(len(w.tracking)) - uint64(w.hits[i]),
				ActiveRequests:         rs.requests}
		}
	})
	return out, err
}

// OverlapScores reports every schedulable rank's tiered overlap and credit
// (docs/selection-api.md, "Loads and scores").
func (q *Queries) OverlapScores(req *ScoreRequest) (*OverlapScoresResponse, error) {
	var out *OverlapScoresResponse
	err := q.scoreRequest(req, func(p *partition, w *work, s *scoring, np normPrompt) {
		out = &OverlapScoresResponse{BlockSize: p.blockSize, NumBlocks: uint64(len(w.blocks)),
			Workers: make([]OverlapScore, len(p.ranks)), SharedCache: SharedCache{Ranges: [][2]uint64{}}}
		for i, rs := range p.ranks {
			t := w.tiers[i]
			out.Workers[i] = OverlapScore{WorkerID: rs.rank.WorkerID, DPRank: rs.rank.DPRank,
				DeviceBlocks: t.Device, HostPinnedBlocks: t.Device + t.Host, DiskBlocks: t.Device + t.Host + t.Disk,
				HostPinnedExtensionBlocks: t.Host, DiskExtensionBlocks: t.Disk,
				RouterCreditBlocks: s.overlapCredit(&costInput{tiers: t}, 1)}
		}
	})
	return out, err
}
