package selection

import "slices"

// Scoring without the partition lock (issue 12, item 4). A selection
// copies what the cost function reads of every rank (its load, whether it
// is down) under partition.mu, releases the lock, scores and picks from
// the copy, and takes the lock again only to re-check the chosen rank and
// book it. The copy is a few machine words a rank, so the lock is held for
// the copy, the load-trie walk and the booking instead of for the whole
// per-rank scoring loop, which was ~55 µs of a ~57 µs hold at 1,024 ranks
// (BENCHMARKS.md, "The partition lock (issue 12, item 4)").
//
// A serial caller sees the same state in both critical sections, so it
// chooses exactly what scoring under one lock would. Concurrent callers
// may score on loads a few bookings old; what must not be stale is
// re-checked under the second lock (stillChoosable), and when the chosen
// rank no longer qualifies the selection is made again with the lock
// held, as before the split.

// rankView is what choose reads of one rank's mutable state, copied under
// partition.mu. rs.rank is never written after the rank is created, so
// choose reads it through rs; everything else of rs it must not read
// without the lock.
type rankView struct {
	rs            *rankState
	prefillTokens uint64
	requests      uint64
	decodeWeight  float64
	down          bool
	loadOnly      bool
}

// viewOf copies what choose reads of rs; rs's partition lock must be held.
func viewOf(rs *rankState) rankView {
	return rankView{rs: rs, prefillTokens: rs.prefillTokens, requests: rs.requests,
		decodeWeight: rs.decodeWeight, down: rs.down, loadOnly: rs.loadOnly}
}

func (v *rankView) decodeBlocks() uint64 { return decodeBlocksOf(v.decodeWeight) }

// full reports whether the rank was at Config.MaxReservationsPerRank.
func (v *rankView) full(cfg *Config) bool {
	return cfg.MaxReservationsPerRank > 0 && v.requests >= uint64(cfg.MaxReservationsPerRank)
}

// snapshot fills w.views and w.hits for every rank of p, and w.taints
// when withTaints (the request filters or weighs by taints). p.mu must be
// held. The index's matches are mapped to ranks afterwards, without the
// lock (fillTiers): with a prompt whose prefix every worker caches that is
// a map lookup per rank.
func (p *partition) snapshot(w *work, withTaints bool) {
	n := len(p.ranks)
	w.blockSize = p.blockSize
	w.hits = resize(w.hits, n)
	clear(w.hits)
	p.load.countActive(w.tracking, w.hits)
	w.views = resize(w.views, n)
	for i, rs := range p.ranks {
		w.views[i] = viewOf(rs)
	}
	w.taints = w.taints[:0]
	if withTaints {
		// The catalog replaces a rank's taint slice, never writes into it,
		// so copying the slice header is enough.
		for _, rs := range p.ranks {
			w.taints = append(w.taints, rs.taints)
		}
	}
}

// fillTiers sets w.tiers from the index's matches for the ranks of the
// snapshot in w, as scoreInputs does from the partition: a rank the index
// matches that is not in the snapshot, or is load-only, gets none. It
// needs no lock: the views are sorted like partition.ranks (sortRanks), by
// a rank's identity, which never changes.
func (w *work) fillTiers() {
	w.tiers = resize(w.tiers, len(w.views))
	clear(w.tiers)
	for _, m := range w.matches.List {
		i, ok := slices.BinarySearchFunc(w.views, m.Rank, func(v rankView, r Rank) int { return compareRanks(v.rs.rank, r) })
		if ok && !w.views[i].loadOnly {
			w.tiers[i] = m.Tiers
		}
	}
}

// stillChoosable reports, with p.mu held, whether the rank sel chose from
// w's snapshot still stands: it is still in the partition, not down, its
// cache credit is what the snapshot had, it still has the required
// taints, the session's binding is the one choose saw, and, if its load
// moved meanwhile, it is still the cheapest (stillCheapest). Without that
// last check callers scoring the same snapshot would all book the rank it
// showed cheapest (a herd). Other ranks' loads may have moved, which at
// worst misses a rank that became cheaper meanwhile.
func (e *selector) stillChoosable(p *partition, sel *selection, c choice, s *scoring, w *work) bool {
	rs, v := sel.rs, &sel.view
	if rs.removed || p.byRank[rs.rank] != rs {
		return false
	}
	if rs.down || rs.loadOnly != v.loadOnly {
		return false
	}
	if rs.requests != v.requests || rs.prefillTokens != v.prefillTokens || rs.decodeWeight != v.decodeWeight {
		if !e.stillCheapest(p, sel, s, w) {
			return false
		}
	}
	if c.book && rs.full(e.cfg.get()) {
		return false
	}
	if required := c.requiredTaints(); len(required) > 0 && !hasAll(rs.taints, required) {
		return false
	}
	if c.session != "" && e.affinity.enabled() {
		bound, ok := e.affinity.bound(sessionKey{p.key, c.session})
		if ok != sel.boundSeen || ok && bound != sel.bound {
			return false
		}
	}
	return true
}

// stillCheapest reports whether a rank chosen as the cheapest, whose load
// moved after the snapshot, still costs no more than the snapshot's next
// cheapest candidate; p.mu must be held. Its cost is recomputed from its
// load and in-flight blocks of this prompt now, and what the snapshot had
// of the rest (the least prefill load, which only makes the recomputed
// cost higher if it rose). When the pick stands, sel takes the rank's
// in-flight blocks as they are now. A pick not made on cost (pinned,
// bound, an affinity target, a softmax draw) is never herded by cost, so
// any load change leaves it standing.
func (e *selector) stillCheapest(p *partition, sel *selection, s *scoring, w *work) bool {
	if sel.runnerUp < 0 {
		return true
	}
	rs := sel.rs
	hits := p.load.activeFor(w.tracking, rs)
	nTrack := uint64(len(w.tracking))
	newBlks := nTrack - uint64(hits)
	now := viewOf(rs)
	in := s.costInputOf(&now, sel.tiers, hits, nTrack, e.cfg.get().TrackActiveBlocks, sel.taintMult)
	if s.cost(&in, sel.isl, w.blockSize, sel.minPrefill) > sel.runnerUp {
		return false
	}
	sel.newBlks = newBlks
	if !rs.loadOnly {
		sel.inflight = hits
	}
	return true
}
