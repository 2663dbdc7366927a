package selection

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
)

// The selection pipeline (docs/selection-api.md, "How a rank is chosen"): normalise the prompt, filter
// candidates, read overlaps, score, pick, and optionally book.

// selector is the selection pipeline and what it books into: it reads
// the catalog's partitions and the index, scores, chooses, and books the
// choice (bookings) or remembers it (pending). It owns no state of its
// own; Router builds it from the parts it shares with them.
type selector struct {
	cfg      *liveConfig
	index    Indexer
	recorder BookingRecorder // non-nil when bookings feed the index
	catalog  *Catalog
	book     *bookings
	pending  *pendingCache
	affinity *affinityTable // nil when session affinity is off
}

// work is the per-call scratch space, pooled so a selection allocates
// nothing per token or per block.
type work struct {
	blocks   []uint64
	tracking []uint64
	matches  Matches
	tiers    []Tiers
	hits     []uint32
	costs    []float64
	cands    []int
	// chained is true when tracking holds the public sequence hashes of
	// blocks (computed here), which chain-keyed indexes can use as is.
	chained bool
}

var workPool = sync.Pool{New: func() any { return new(work) }}

func getWork() *work { return workPool.Get().(*work) }

// findMatches reads the index, handing over the chain when it has one.
func (e *selector) findMatches(key PartitionKey, w *work) {
	if ci, ok := e.index.(ChainIndexer); ok && w.chained {
		ci.FindMatchesChain(key, w.tracking, &w.matches)
		return
	}
	e.index.FindMatches(key, w.blocks, &w.matches)
}

// recordBooking feeds a booking to an index that learns from them.
func (e *selector) recordBooking(key PartitionKey, rank Rank, w *work) {
	if e.recorder == nil {
		return
	}
	if cr, ok := e.recorder.(ChainRecorder); ok && w.chained {
		cr.RecordBookingChain(key, rank, w.blocks, w.tracking)
		return
	}
	e.recorder.RecordBooking(key, rank, w.blocks)
}

func putWork(w *work) {
	w.blocks, w.tracking = w.blocks[:0], w.tracking[:0]
	w.matches.Reset()
	workPool.Put(w)
}

// normPrompt is what normalize learns of a prompt besides the hashes it
// writes to the work buffers (w.blocks for the index, w.tracking for load
// accounting): whether there are block hashes, and the input length.
type normPrompt struct {
	hasBlocks bool // false for an explicit booking with sequence hashes only
	isl       uint64
}

// normalize fills w.blocks and w.tracking from pr (docs/selection-api.md, "The
// prompt"; docs/hashing.md). needBlocks
// is false only for explicit bookings, which do not look up the index.
func normalize(pr *Prompt, p *partition, s *scoring, w *work, needBlocks bool) (normPrompt, error) {
	tokens := pr.TokenIDs
	mm := pr.BlockMMInfos
	if pr.MMRoutingInfo != nil && len(pr.MMRoutingInfo.RoutingTokenIDs) > 0 {
		tokens, mm = pr.MMRoutingInfo.RoutingTokenIDs, pr.MMRoutingInfo.BlockMMInfos
	}
	if tokens != nil {
		eagle := p.isEagle
		if pr.IsEagle != nil {
			eagle = *pr.IsEagle
		}
		opt := HashOptions{Seed: SaltedSeed(pr.LoraName, pr.CacheSalt), Eagle: eagle, MM: mm}
		w.blocks = AppendBlockHashes(w.blocks[:0], tokens, int(p.blockSize), opt)
		if s.assumeReuse {
			w.tracking = AppendSequenceHashes(w.tracking[:0], w.blocks)
		} else {
			w.tracking = appendRandom(w.tracking[:0], len(w.blocks))
		}
		w.chained = s.assumeReuse
		return normPrompt{hasBlocks: true, isl: uint64(len(tokens))}, nil
	}
	if needBlocks && pr.BlockHashes == nil {
		return normPrompt{}, errorf(KindBadRequest, "block_hashes is required without token_ids")
	}
	if pr.SequenceHashes == nil {
		return normPrompt{}, errorf(KindBadRequest, "sequence_hashes is required without token_ids")
	}
	if pr.ISLTokens == nil {
		return normPrompt{}, errorf(KindBadRequest, "isl_tokens is required without token_ids")
	}
	if pr.BlockHashes != nil && len(pr.BlockHashes) != len(pr.SequenceHashes) {
		return normPrompt{}, errorf(KindBadRequest, "block_hashes length %d must match sequence_hashes length %d", len(pr.BlockHashes), len(pr.SequenceHashes))
	}
	if *pr.ISLTokens == 0 {
		return normPrompt{}, errorf(KindBadRequest, "isl_tokens must be greater than 0")
	}
	w.chained = false
	w.blocks = append(w.blocks[:0], pr.BlockHashes...)
	if s.assumeReuse {
		w.tracking = append(w.tracking[:0], pr.SequenceHashes...)
	} else {
		w.tracking = appendRandom(w.tracking[:0], len(pr.SequenceHashes))
	}
	return normPrompt{hasBlocks: pr.BlockHashes != nil, isl: *pr.ISLTokens}, nil
}

func appendRandom(dst []uint64, n int) []uint64 {
	for range n {
		dst = append(dst, rand.Uint64())
	}
	return dst
}

// scoreInputs fills w.tiers and w.hits for every rank of p. It must run
// with p.mu held; the matches were read from the index before.
func (p *partition) scoreInputs(w *work) {
	n := len(p.ranks)
	w.tiers = resize(w.tiers, n)
	w.hits = resize(w.hits, n)
	clear(w.tiers)
	clear(w.hits)
	for _, m := range w.matches.List {
		if rs := p.byRank[m.Rank]; rs != nil && !rs.loadOnly {
			w.tiers[rs.idx] = m.Tiers
		}
	}
	p.load.countActive(w.tracking, w.hits)
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// selection is the outcome of choose.
type selection struct {
	rs      *rankState
	tiers   Tiers
	cached  uint64
	prefill uint64 // effective prefill tokens
	newBlks uint64
	longest uint32
	potDec  uint64
	explain []Candidate
	isl     uint64
	// inflight is how many leading blocks of the prompt bookings in
	// flight on the rank hold: prompts ahead of this one that the engine
	// caches by the time it admits this one.
	inflight uint32
}

// choice is what choose needs to know of the request besides its prompt:
// where it may go, and whether the pick is explained and booked.
type choice struct {
	placement *Placement
	session   string // bound session target lookup key (already resolved)
	explain   bool
	book      bool // the pick will be booked: full ranks are not candidates
}

// choose scores the candidate ranks of p and picks one. p.mu must be held.
func (e *selector) choose(p *partition, w *work, s *scoring, np normPrompt, c choice) (selection, error) {
	p.scoreInputs(w)
	pl := c.placement
	w.cands = w.cands[:0]
	var allowed map[uint64]bool
	if pl != nil && pl.AllowedWorkerIDs != nil {
		allowed = make(map[uint64]bool, len(pl.AllowedWorkerIDs))
		for _, id := range pl.AllowedWorkerIDs {
			allowed[id] = true
		}
	}
	var required []string
	var preferred map[string]float32
	if pl != nil && pl.RoutingConstraints != nil {
		required, preferred = pl.RoutingConstraints.RequiredTaints, pl.RoutingConstraints.PreferredTaints
	}
	full := 0
	for i, rs := range p.ranks {
		if allowed != nil && !allowed[rs.rank.WorkerID] {
			continue
		}
		if rs.down || pl != nil && slices.Contains(pl.ExcludeRanks, rs.rank) {
			continue
		}
		if !hasAll(rs.taints, required) {
			continue
		}
		if c.book && rs.full(e.cfg.get()) {
			full++
			continue
		}
		w.cands = append(w.cands, i)
	}
	if len(w.cands) == 0 && full > 0 {
		return selection{}, errorf(KindNotReady, "every eligible worker of %s holds %d reservations, the most max_reservations_per_rank allows; free reservations or wait for them to expire",
			p.key, e.cfg.get().MaxReservationsPerRank)
	}
	if len(w.cands) == 0 {
		if len(p.ranks) > 0 && (allowed != nil || len(required) > 0 || pl != nil && len(pl.ExcludeRanks) > 0) {
			return selection{}, errorf(KindNotReady, "all eligible workers were filtered for %s", p.key)
		}
		if len(p.ranks) > 0 {
			return selection{}, errorf(KindNotReady, "every worker of %s is unreachable", p.key)
		}
		return selection{}, errNoSchedulable(p.key.Model, p.key.Group)
	}
	var minPrefill uint64
	var longest uint32
	for k, i := range w.cands {
		if rs := p.ranks[i]; k == 0 || rs.prefillTokens < minPrefill {
			minPrefill = rs.prefillTokens
		}
		longest = max(longest, w.tiers[i].Device)
	}
	w.costs = resize(w.costs, len(w.cands))
	nTrack := uint64(len(w.tracking))
	for k, i := range w.cands {
		rs := p.ranks[i]
		in := costInput{
			tiers:          w.tiers[i],
			activePrefill:  rs.prefillTokens,
			hasLoad:        true,
			potentialDec:   rs.decodeBlocks() + nTrack - uint64(w.hits[i]),
			activeRequests: rs.requests,
			taintMult:      preferredTaintMultiplier(rs.taints, preferred),
		}
		if !e.cfg.get().TrackActiveBlocks {
			in.potentialDec = 0
		}
		w.costs[k] = s.cost(&in, np.isl, p.blockSize, minPrefill)
	}
	chosen := -1
	// Pinned: a hard pin bypasses scoring but must be eligible.
	if pl != nil && pl.PinnedWorker != nil {
		want := Rank{pl.PinnedWorker.WorkerID, pl.PinnedWorker.DPRank}
		for k, i := range w.cands {
			if p.ranks[i].rank == want {
				chosen = k
			}
		}
		if chosen < 0 {
			return selection{}, errorf(KindNotReady, "pinned worker %d dp_rank %d is not eligible in %s", want.WorkerID, want.DPRank, p.key)
		}
	}
	// Preferred: the session's bound rank, else the affinity target (its
	// cheapest rank when no dp_rank is given). An ineligible preference is
	// ignored and the request is scored normally.
	if chosen < 0 && c.session != "" && e.affinity.enabled() {
		if bound, ok := e.affinity.bound(sessionKey{p.key, c.session}); ok {
			for k, i := range w.cands {
				if p.ranks[i].rank == bound {
					chosen = k
				}
			}
			if chosen < 0 {
				// The bound worker departed: start the session afresh.
				e.affinity.forget(sessionKey{p.key, c.session})
			}
		}
	}
	if chosen < 0 && pl != nil && pl.AffinityTarget != nil {
		t := pl.AffinityTarget
		for k, i := range w.cands {
			rk := p.ranks[i].rank
			if rk.WorkerID == t.WorkerID && (t.DPRank == nil || *t.DPRank == rk.DPRank) &&
				(chosen < 0 || w.costs[k] < w.costs[chosen]) {
				chosen = k
			}
		}
	}
	if chosen < 0 {
		chosen = pick(w.costs, s.temperature, e.cfg.get().rand)
	}
	i := w.cands[chosen]
	rs := p.ranks[i]
	sel := selection{rs: rs, tiers: w.tiers[i], longest: longest, isl: np.isl}
	sel.cached = s.cachedTokens(sel.tiers, p.blockSize)
	sel.prefill = effectivePrefill(np.isl, sel.cached)
	sel.newBlks = nTrack - uint64(w.hits[i])
	if !rs.loadOnly { // a load-only rank is credited no cache, booked or indexed
		sel.inflight = w.hits[i]
	}
	sel.potDec = rs.decodeBlocks() + sel.newBlks
	if c.explain {
		sel.explain = make([]Candidate, len(w.cands))
		for k, j := range w.cands {
			q := p.ranks[j]
			sel.explain[k] = Candidate{WorkerID: q.rank.WorkerID, DPRank: q.rank.DPRank, DeviceBlocks: w.tiers[j].Device,
				PrefillTokens: q.prefillTokens, DecodeBlocks: q.decodeBlocks(), Cost: w.costs[k]}
		}
	}
	return sel, nil
}

func hasAll(have, want []string) bool {
	for _, t := range want {
		found := false
		for _, h := range have {
			if h == t {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// response builds the SelectResponse for a selection.
func response(p *partition, sel *selection, id string) *SelectResponse {
	bs := uint64(p.blockSize)
	resp := &SelectResponse{
		SelectionID:            id,
		ModelName:              p.key.Model,
		RoutingGroup:           p.key.Group,
		WorkerID:               sel.rs.rank.WorkerID,
		DPRank:                 sel.rs.rank.DPRank,
		Endpoint:               sel.rs.endpoint,
		BlockSize:              p.blockSize,
		EffectivePrefillTokens: sel.prefill,
		PotentialDecodeBlocks:  sel.potDec,
		CachedTokens:           uint64(sel.tiers.Device) * bs,
		ExpectedCachedTokens:   uint64(max(sel.tiers.Device, sel.inflight)) * bs,
		Candidates:             sel.explain,
		Overlap: Overlap{
			LongestMatched: uint64(sel.longest) * bs,
			GPU:            uint64(sel.tiers.Device) * bs,
			CPU:            uint64(sel.tiers.Device+sel.tiers.Host) * bs,
			Disk:           uint64(sel.tiers.Device+sel.tiers.Host+sel.tiers.Disk) * bs,
		},
	}
	return resp
}

// fillDP reports the device match of every rank of the chosen worker.
// p.mu must be held and w must still hold this selection's tiers.
func fillDP(p *partition, w *work, resp *SelectResponse) {
	bs := uint64(p.blockSize)
	resp.Overlap.DP = map[string]uint64{}
	for i, rs := range p.ranks {
		if rs.rank.WorkerID == resp.WorkerID {
			resp.Overlap.DP[strconv.FormatUint(uint64(rs.rank.DPRank), 10)] = uint64(w.tiers[i].Device) * bs
		}
	}
}

// busy fills decode_busy (and the advisory worker_load) when the
// thresholds and capacities are known.
func (e *selector) busy(sel *selection, resp *SelectResponse, advisory bool) {
	rs := sel.rs
	if t := e.cfg.get().DecodeBusyThreshold; t != nil && rs.totalKV > 0 {
		b := float64(resp.PotentialDecodeBlocks) > *t*float64(rs.totalKV)
		resp.DecodeBusy = &b
	}
	if !advisory {
		return
	}
	wl := &WorkerLoad{ActivePrefillTokens: rs.prefillTokens}
	if rs.maxBatched > 0 {
		v := rs.maxBatched
		wl.PrefillTokenCapacity = &v
		if t := e.cfg.get().PrefillBusyThreshold; t != nil {
			b := float64(rs.prefillTokens) > *t*float64(rs.maxBatched)
			wl.PrefillBusy = &b
		}
	}
	if rs.totalKV > 0 {
		v := rs.totalKV
		wl.TotalKVBlocks = &v
	}
	resp.WorkerLoad = wl
}
