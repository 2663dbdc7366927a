package selection

import (
	"math"
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
	affinity *affinityTable     // nil when session affinity is off
	timing   func(SelectTiming) // WithSelectTiming's hook, nil without it
	// afterChoose, when set (by tests only), runs between choosing from
	// the snapshot and re-taking the lock to book: where another caller
	// can change what the choice was made on.
	afterChoose func(*selection)
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
	views    []rankView // the partition's ranks as the snapshot saw them
	taints   [][]string // their taints, when the request uses taints
	// blockSize is the partition's block size as the snapshot saw it (the
	// catalog may change it under the lock while the partition has one
	// worker).
	blockSize uint32
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

// bookingRecord is a booking's record for an index that learns from
// bookings: made and fed at once (recordBooking), or kept until the
// worker answers (deferRecord, SelectRequest.RecordOnAnswer).
type bookingRecord struct {
	key           PartitionKey
	rank          Rank
	blocks, chain []uint64 // chain is nil when the keys are not the tracking hashes
}

// recordOf is w's record, on w's buffers.
func (e *selector) recordOf(key PartitionKey, rank Rank, w *work) bookingRecord {
	d := bookingRecord{key: key, rank: rank, blocks: w.blocks}
	if _, ok := e.recorder.(ChainRecorder); ok && w.chained {
		d.chain = w.tracking
	}
	return d
}

// recordBooking feeds a booking to an index that learns from them.
func (e *selector) recordBooking(key PartitionKey, rank Rank, w *work) {
	if e.recorder == nil {
		return
	}
	d := e.recordOf(key, rank, w)
	e.record(&d)
}

// deferRecord copies what recordBooking would record, for later (w's
// buffers go back to their pool); nil when nothing learns from bookings.
func (e *selector) deferRecord(key PartitionKey, rank Rank, w *work) *bookingRecord {
	if e.recorder == nil || len(w.blocks) == 0 {
		return nil
	}
	d := e.recordOf(key, rank, w)
	d.blocks, d.chain = slices.Clone(d.blocks), slices.Clone(d.chain)
	return &d
}

// record feeds a booking's record to the index.
func (e *selector) record(d *bookingRecord) {
	if d.chain != nil {
		e.recorder.(ChainRecorder).RecordBookingChain(d.key, d.rank, d.blocks, d.chain)
		return
	}
	e.recorder.RecordBooking(d.key, d.rank, d.blocks)
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

// maxISLTokens bounds the isl_tokens a hash-path request states (a token
// path's length is its token_ids'): 16M tokens, above any model's
// context. A booking adds it to its rank's prefill load, so an unbounded
// one could wrap the rank's sum back to nothing (a booking of 2^64 -
// 50,000 tokens cancelled another's 50,000 in /loads and in the cost).
const maxISLTokens = 1 << 24

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
		if s.assumeReuse {
			// Both chains in one pass (AppendChainedHashes says why).
			w.blocks, w.tracking = AppendChainedHashes(w.blocks[:0], w.tracking[:0], tokens, int(p.blockSize), opt)
		} else {
			w.blocks = AppendBlockHashes(w.blocks[:0], tokens, int(p.blockSize), opt)
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
	if *pr.ISLTokens > maxISLTokens {
		return normPrompt{}, errorf(KindBadRequest, "isl_tokens must be at most %d", maxISLTokens)
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
	potDec  uint64
	explain []Candidate
	isl     uint64
	// inflight is how many leading blocks of the prompt bookings in
	// flight on the rank hold: prompts ahead of this one that the engine
	// caches by the time it admits this one.
	inflight uint32
	// What choose saw that the booking re-checks (stillChoosable): the
	// rank as the snapshot had it and the session's binding.
	view      rankView
	bound     Rank
	boundSeen bool
	// For a rank chosen as the cheapest at temperature 0: the next
	// cheapest candidate's cost (-1 otherwise), and what the chosen rank's
	// cost is recomputed from, besides its load and tiers, if its load
	// moves before the booking.
	runnerUp   float64
	taintMult  float64
	minPrefill uint64
}

// choice is what choose needs to know of the request besides its prompt:
// where it may go, and whether the pick is explained and booked.
type choice struct {
	placement *Placement
	session   string // bound session target lookup key (already resolved)
	explain   bool
	book      bool // the pick will be booked: full ranks are not candidates
}

// requiredTaints are the taints a candidate must have.
func (c choice) requiredTaints() []string {
	if pl := c.placement; pl != nil && pl.RoutingConstraints != nil {
		return pl.RoutingConstraints.RequiredTaints
	}
	return nil
}

// usesTaints reports whether the request filters or weighs ranks by
// their taints, so the snapshot must copy them.
func (c choice) usesTaints() bool {
	pl := c.placement
	return pl != nil && pl.RoutingConstraints != nil &&
		(len(pl.RoutingConstraints.RequiredTaints) > 0 || len(pl.RoutingConstraints.PreferredTaints) > 0)
}

// choose scores the candidate ranks of the snapshot in w (p.snapshot) and
// picks one. It reads nothing of p that the partition's lock guards, so
// it runs with or without p.mu held.
func (e *selector) choose(p *partition, w *work, s *scoring, np normPrompt, c choice) (selection, error) {
	w.fillTiers()
	pl := c.placement
	cfg := e.cfg.get()
	w.cands = w.cands[:0]
	var allowed map[uint64]bool
	if pl != nil && pl.AllowedSet != nil {
		allowed = pl.AllowedSet
	} else if pl != nil && pl.AllowedWorkerIDs != nil {
		allowed = make(map[uint64]bool, len(pl.AllowedWorkerIDs))
		for _, id := range pl.AllowedWorkerIDs {
			allowed[id] = true
		}
	}
	required := c.requiredTaints()
	var preferred map[string]float32
	if pl != nil && pl.RoutingConstraints != nil {
		preferred = pl.RoutingConstraints.PreferredTaints
	}
	taintsOf := func(i int) []string {
		if len(w.taints) == 0 {
			return nil
		}
		return w.taints[i]
	}
	full := 0
	for i := range w.views {
		v := &w.views[i]
		rank := v.rs.rank
		if allowed != nil && !allowed[rank.WorkerID] {
			continue
		}
		if v.down || pl != nil && slices.Contains(pl.ExcludeRanks, rank) {
			continue
		}
		if !hasAll(taintsOf(i), required) {
			continue
		}
		if c.book && v.full(cfg) {
			full++
			continue
		}
		w.cands = append(w.cands, i)
	}
	if len(w.cands) == 0 && full > 0 {
		return selection{}, errorf(KindNotReady, "every eligible worker of %s holds %d reservations, the most max_reservations_per_rank allows; free reservations or wait for them to expire",
			p.key, cfg.MaxReservationsPerRank)
	}
	if len(w.cands) == 0 {
		if len(w.views) > 0 && (allowed != nil || len(required) > 0 || pl != nil && len(pl.ExcludeRanks) > 0) {
			return selection{}, errorf(KindNotReady, "all eligible workers were filtered for %s", p.key)
		}
		if len(w.views) > 0 {
			return selection{}, errorf(KindNotReady, "every worker of %s is unreachable", p.key)
		}
		return selection{}, errNoSchedulable(p.key.Model, p.key.Group)
	}
	var minPrefill uint64
	for k, i := range w.cands {
		if v := &w.views[i]; k == 0 || v.prefillTokens < minPrefill {
			minPrefill = v.prefillTokens
		}
	}
	w.costs = resize(w.costs, len(w.cands))
	nTrack := uint64(len(w.tracking))
	for k, i := range w.cands {
		in := s.costInputOf(&w.views[i], w.tiers[i], w.hits[i], nTrack, cfg.TrackActiveBlocks,
			preferredTaintMultiplier(taintsOf(i), preferred))
		w.costs[k] = s.cost(&in, np.isl, w.blockSize, minPrefill)
	}
	chosen := -1
	// Pinned: a hard pin bypasses scoring but must be eligible.
	if pl != nil && pl.PinnedWorker != nil {
		want := Rank{pl.PinnedWorker.WorkerID, pl.PinnedWorker.DPRank}
		for k, i := range w.cands {
			if w.views[i].rs.rank == want {
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
	var bound Rank
	var boundSeen bool
	if c.session != "" && e.affinity.enabled() {
		bound, boundSeen = e.affinity.bound(sessionKey{p.key, c.session})
	}
	if chosen < 0 && boundSeen {
		for k, i := range w.cands {
			if w.views[i].rs.rank == bound {
				chosen = k
			}
		}
		if chosen < 0 {
			// The bound worker departed: start the session afresh.
			e.affinity.forget(sessionKey{p.key, c.session})
			boundSeen = false
		}
	}
	if chosen < 0 && pl != nil && pl.AffinityTarget != nil {
		t := pl.AffinityTarget
		for k, i := range w.cands {
			rk := w.views[i].rs.rank
			if rk.WorkerID == t.WorkerID && (t.DPRank == nil || *t.DPRank == rk.DPRank) &&
				(chosen < 0 || w.costs[k] < w.costs[chosen]) {
				chosen = k
			}
		}
	}
	cheapest := false // chosen as the cheapest rank, which the booking may re-check
	if chosen < 0 {
		chosen = pick(w.costs, s.temperature, cfg.rand)
		cheapest = s.temperature <= 0
	}
	i := w.cands[chosen]
	v := &w.views[i]
	sel := selection{rs: v.rs, tiers: w.tiers[i], isl: np.isl,
		view: *v, bound: bound, boundSeen: boundSeen, runnerUp: -1}
	if cheapest {
		sel.runnerUp = math.Inf(1)
		for k, c := range w.costs {
			if k != chosen && c < sel.runnerUp {
				sel.runnerUp = c
			}
		}
		sel.taintMult = preferredTaintMultiplier(taintsOf(i), preferred)
		sel.minPrefill = minPrefill
	}
	sel.cached = s.cachedTokens(sel.tiers, w.blockSize)
	sel.prefill = effectivePrefill(np.isl, sel.cached)
	sel.newBlks = nTrack - uint64(w.hits[i])
	if !v.loadOnly { // a load-only rank is credited no cache, booked or indexed
		sel.inflight = w.hits[i]
	}
	sel.potDec = v.decodeBlocks() + sel.newBlks
	if c.explain {
		sel.explain = make([]Candidate, len(w.cands))
		for k, j := range w.cands {
			q := &w.views[j]
			sel.explain[k] = Candidate{WorkerID: q.rs.rank.WorkerID, DPRank: q.rs.rank.DPRank, DeviceBlocks: w.tiers[j].Device,
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
		Overlap:                overlapOf(sel.tiers, bs),
	}
	return resp
}

// overlapOf is one rank's overlap summary, in tokens: cpu and disk are
// cumulative through the tiers above them, and longest_matched is the
// longest of the three (Dynamo's per-instance summary).
func overlapOf(t Tiers, bs uint64) Overlap {
	o := Overlap{GPU: uint64(t.Device) * bs, CPU: uint64(t.Device+t.Host) * bs,
		Disk: uint64(t.Device+t.Host+t.Disk) * bs}
	o.LongestMatched = max(o.GPU, o.CPU, o.Disk)
	return o
}

// fillDP reports the device match of every rank of the chosen worker,
// from the snapshot in w (which must still hold this selection's tiers),
// and makes the summary the worker's, as Dynamo's is: each figure the
// largest over its ranks, so that a pick on one rank still says what its
// worker holds on another.
func fillDP(w *work, resp *SelectResponse) {
	bs := uint64(w.blockSize)
	resp.Overlap.DP = map[string]uint64{}
	for i := range w.views {
		if rs := w.views[i].rs; rs.rank.WorkerID == resp.WorkerID {
			o := overlapOf(w.tiers[i], bs)
			resp.Overlap.DP[strconv.FormatUint(uint64(rs.rank.DPRank), 10)] = o.GPU
			resp.Overlap.GPU = max(resp.Overlap.GPU, o.GPU)
			resp.Overlap.CPU = max(resp.Overlap.CPU, o.CPU)
			resp.Overlap.Disk = max(resp.Overlap.Disk, o.Disk)
		}
	}
	resp.Overlap.LongestMatched = max(resp.Overlap.GPU, resp.Overlap.CPU, resp.Overlap.Disk)
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
	wl := &WorkerLoad{ActivePrefillTokens: rs.prefillTokens, PrefillTokenCapacity: rs.maxBatched}
	if wl.PrefillTokenCapacity == 0 {
		wl.PrefillTokenCapacity = DefaultPrefillCapacity
	}
	if t := e.cfg.get().PrefillBusyThreshold; t != nil {
		b := float64(rs.prefillTokens) > *t*float64(wl.PrefillTokenCapacity)
		wl.PrefillBusy = &b
	}
	if rs.totalKV > 0 {
		v := rs.totalKV
		wl.TotalKVBlocks = &v
	}
	resp.WorkerLoad = wl
}
