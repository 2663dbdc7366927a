package selection

import "slices"

// Select picks a rank without booking load (docs/selection-api.md,
// "Selecting"). With a
// selection_id the pick is cached so CreateReservation can book it by id.
func (r *Router) Select(req *SelectRequest) (*SelectResponse, error) {
	return r.selectRequest(req, false, false)
}

// SelectAndReserve picks a rank and books the request on it atomically
// (docs/selection-api.md, "Selecting"). The booking is keyed by selection_id, a UUIDv4 if absent.
func (r *Router) SelectAndReserve(req *SelectRequest) (*SelectResponse, error) {
	return r.selectRequest(req, true, false)
}

// SelectAndReserveExplained is SelectAndReserve with the per-candidate
// breakdown filled in resp.Candidates (for the proxy's explain output).
func (r *Router) SelectAndReserveExplained(req *SelectRequest) (*SelectResponse, error) {
	return r.selectRequest(req, true, true)
}

func checkSession(id string) error {
	if len(id) > maxSessionIDBytes {
		return errorf(KindBadRequest, "session_id must be at most %d bytes", maxSessionIDBytes)
	}
	return nil
}

func (r *Router) selectRequest(req *SelectRequest, book, explain bool) (*SelectResponse, error) {
	session := req.Placement.session()
	q, err := r.setupRequest(&req.Partition, req.RouterConfigOverride, &req.Prompt, session)
	if err != nil {
		return nil, err
	}
	defer putWork(q.w)
	key, p, s, w, np := q.key, q.p, &q.s, q.w, q.np
	id := req.SelectionID
	if book {
		if id == "" {
			id = newSelectionID()
		}
		if err := r.claim(id, req.Client); err != nil {
			return nil, err
		}
	}
	p.mu.Lock()
	sel, err := r.choose(p, w, s, np, choice{placement: &req.Placement, session: session, explain: explain, book: book})
	if err != nil {
		p.mu.Unlock()
		if book {
			r.unclaim(id, req.Client)
		}
		return nil, err
	}
	resp := r.response(p, &sel, id)
	if !req.Lean {
		fillDP(p, w, resp)
	}
	if !book {
		r.busy(&sel, resp, req.Advisory)
		p.mu.Unlock()
		if id != "" {
			r.pending.insert(&pendingEntry{
				key: pendingKey{key, id}, rank: sel.rs.rank,
				blocks: slices.Clone(w.blocks), hashes: slices.Clone(w.tracking),
				isl: np.isl, prefill: sel.prefill, track: s.trackPrefill,
				expected: req.ExpectedOutputTokens, lora: req.LoraName, session: session,
			})
		}
		return resp, nil
	}
	b, err := r.bookLocked(p, sel.rs, id, session, req.Client, w.tracking, np.isl, sel.prefill, s.trackPrefill, req.ExpectedOutputTokens)
	if err != nil {
		p.mu.Unlock()
		r.unclaim(id, req.Client)
		return nil, err
	}
	r.busy(&sel, resp, false)
	p.mu.Unlock()
	r.commit(id, b)
	r.recordBooking(key, sel.rs.rank, w)
	isl, track := np.isl, s.trackPrefill
	resp.SequenceHashes, resp.ISLTokens, resp.TrackPrefillTokens = b.hashes, &isl, &track
	return resp, nil
}

// bookLocked books a request on rs; p.mu must be held. A rank at
// MaxReservationsPerRank is refused. With a session and affinity on, it
// takes the session's lease first (and may refuse).
func (r *Router) bookLocked(p *partition, rs *rankState, id, session, client string, tracking []uint64,
	isl, prefill uint64, track bool, expected *uint32) (*booking, error) {
	if rs.full(&r.cfg) {
		return nil, errorf(KindNotReady, "worker %d dp_rank %d holds %d reservations, the most max_reservations_per_rank allows",
			rs.rank.WorkerID, rs.rank.DPRank, r.cfg.MaxReservationsPerRank)
	}
	leased := false
	if session != "" && r.affinity.enabled() {
		var err error
		if leased, err = r.affinity.acquire(sessionKey{p.key, session}, rs.rank); err != nil {
			return nil, err
		}
	}
	b := &booking{id: id, key: p.key, part: p, rs: rs, hashes: slices.Clone(tracking),
		isl: isl, expected: expected, client: client, createdAt: r.now()}
	if leased {
		b.session = session
	}
	if track {
		b.prefill = prefill
	}
	p.load.add(b, r.cfg.TrackActiveBlocks)
	return b, nil
}

// CreateReservation books a request (docs/selection-api.md,
// "Reservations"): from the pending cache
// when only selection_id is given, or explicitly on worker_id/dp_rank.
func (r *Router) CreateReservation(req *ReservationRequest) (*ReservationResponse, error) {
	if req.SelectionID == nil {
		return nil, errorf(KindUnprocessable, "missing field `selection_id`")
	}
	session := req.Placement.session()
	if err := checkSession(session); err != nil {
		return nil, err
	}
	if req.WorkerID != nil {
		return r.explicitReservation(req, session)
	}
	return r.cachedReservation(req, session)
}

func (r *Router) cachedReservation(req *ReservationRequest, session string) (*ReservationResponse, error) {
	id, key := *req.SelectionID, req.Partition.Key()
	pk := pendingKey{key, id}
	e := r.pending.peek(pk)
	if e == nil {
		return nil, errorf(KindNotFound, "no pending selection %s for %s (expired, already used, or never selected)", id, key)
	}
	if session == "" {
		session = e.session
	}
	if err := r.claim(id, req.Client); err != nil {
		return nil, err
	}
	p := r.partition(key)
	if p == nil {
		r.unclaim(id, req.Client)
		return nil, errorf(KindNotFound, "pending selection %s targets worker %d dp_rank %d, which is no longer schedulable", id, e.rank.WorkerID, e.rank.DPRank)
	}
	p.mu.Lock()
	rs := p.byRank[e.rank]
	if rs == nil {
		p.mu.Unlock()
		r.unclaim(id, req.Client)
		return nil, errorf(KindNotFound, "pending selection %s targets worker %d dp_rank %d, which is no longer schedulable", id, e.rank.WorkerID, e.rank.DPRank)
	}
	b, err := r.bookLocked(p, rs, id, session, req.Client, e.hashes, e.isl, e.prefill, e.track, e.expected)
	endpoint := rs.endpoint
	p.mu.Unlock()
	if err != nil {
		r.unclaim(id, req.Client)
		if StatusOf(err) == 400 {
			r.pending.discard(pk) // a hard-affinity refusal consumes the entry
		}
		return nil, err
	}
	r.commit(id, b)
	r.pending.remove(pk, e.generation)
	if r.recorder != nil {
		r.recorder.RecordBooking(key, rs.rank, e.blocks)
	}
	return &ReservationResponse{SelectionID: id, ModelName: key.Model, RoutingGroup: key.Group,
		WorkerID: rs.rank.WorkerID, DPRank: rs.rank.DPRank, Endpoint: endpoint}, nil
}

func (r *Router) explicitReservation(req *ReservationRequest, session string) (*ReservationResponse, error) {
	id, key := *req.SelectionID, req.Partition.Key()
	s, err := r.cfg.scoring(req.RouterConfigOverride)
	if err != nil {
		return nil, err
	}
	track := s.trackPrefill
	if req.TrackPrefillTokens != nil {
		track = *req.TrackPrefillTokens
	}
	rank := Rank{WorkerID: *req.WorkerID}
	if req.DPRank != nil {
		rank.DPRank = *req.DPRank
	} else if wr, ok := r.Worker(rank.WorkerID); ok {
		rank.DPRank = wr.DataParallelStartRank
	}
	notSchedulable := errorf(KindNotFound, "worker %d dp_rank %d is not schedulable in %s", rank.WorkerID, rank.DPRank, key)
	p := r.partition(key)
	if p == nil {
		return nil, notSchedulable
	}
	w := getWork()
	defer putWork(w)
	np, err := r.normalize(&req.Prompt, p, &s, w, false)
	if err != nil {
		return nil, err
	}
	if e := req.EffectivePrefillTokens; e != nil && *e > np.isl {
		return nil, errorf(KindBadRequest, "effective_prefill_tokens (%d) must not exceed isl_tokens (%d)", *e, np.isl)
	}
	prefill := np.isl
	if req.EffectivePrefillTokens != nil {
		prefill = *req.EffectivePrefillTokens
	} else if np.hasBlocks {
		r.index.FindMatches(key, w.blocks, &w.matches)
		for _, m := range w.matches.List {
			if m.Rank == rank {
				prefill = effectivePrefill(np.isl, s.cachedTokens(m.Tiers, p.blockSize))
			}
		}
	}
	if err := r.claim(id, req.Client); err != nil {
		return nil, err
	}
	r.pending.discard(pendingKey{key, id})
	p.mu.Lock()
	rs := p.byRank[rank]
	if rs == nil {
		p.mu.Unlock()
		r.unclaim(id, req.Client)
		return nil, notSchedulable
	}
	b, err := r.bookLocked(p, rs, id, session, req.Client, w.tracking, np.isl, prefill, track, req.ExpectedOutputTokens)
	endpoint := rs.endpoint
	p.mu.Unlock()
	if err != nil {
		r.unclaim(id, req.Client)
		return nil, err
	}
	r.commit(id, b)
	if r.recorder != nil && np.hasBlocks {
		r.recorder.RecordBooking(key, rank, w.blocks)
	}
	return &ReservationResponse{SelectionID: id, ModelName: key.Model, RoutingGroup: key.Group,
		WorkerID: rank.WorkerID, DPRank: rank.DPRank, Endpoint: endpoint}, nil
}
