package selection

import "slices"

// Booking a request: selecting and reserving in one step (SelectAndReserve),
// or reserving a pick made earlier (CreateReservation, from the pending
// cache or on an explicit rank). Each path claims the selection id first
// and either commits the booking or unclaims the id, so an id is booked at
// most once and a failed booking leaves nothing behind.

func checkSession(id string) error {
	if len(id) > maxSessionIDBytes {
		return errorf(KindBadRequest, "session_id must be at most %d bytes", maxSessionIDBytes)
	}
	return nil
}

// maxSelectionIDBytes bounds selection ids. A booking keeps its id until
// it is freed or expires (reservation_ttl, an hour by default), so an
// unbounded id let one client hold its bookings' worth of megabyte ids:
// 1,024 bookings of 4 MB ids held 6.5 GB. Dynamo's ids are UUIDs.
const maxSelectionIDBytes = 256

func checkSelectionID(id string) error {
	if len(id) > maxSelectionIDBytes {
		return errorf(KindBadRequest, "selection_id must be at most %d bytes", maxSelectionIDBytes)
	}
	return nil
}

// selectRequest runs a selection, and books it when book is set; without
// book, a pick with a selection_id is remembered in the pending cache.
func (e *selector) selectRequest(req *SelectRequest, book, explain bool) (*SelectResponse, error) {
	if err := checkSelectionID(req.SelectionID); err != nil {
		return nil, err
	}
	t := newLockTimer()
	session := req.Placement.session()
	q, err := e.setupRequest(&req.Partition, req.RouterConfigOverride, &req.Prompt, session)
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
		if err := e.book.claim(id, req.Client, len(w.tracking)); err != nil {
			return nil, err
		}
	}
	// The booking's copy of the tracking hashes, made outside p.mu: for
	// the proxy (lean) in a pooled buffer (hashbuf.go), which the response
	// does not carry; for the selection API a fresh slice the response
	// shares.
	var hashes []uint64
	var buf *hashBuf
	switch {
	case book && req.Lean:
		buf = newHashBuf(w.tracking)
		hashes = buf.hashes
	case book:
		hashes = slices.Clone(w.tracking)
	}
	c := choice{placement: &req.Placement, session: session, explain: explain, book: book}
	// Copy the ranks' loads under the lock and score them without it
	// (snapshot.go).
	t.lock(p)
	p.snapshot(w, c.usesTaints())
	t.unlock(p)
	sel, err := e.choose(p, w, s, np, c)
	if e.afterChoose != nil && err == nil {
		e.afterChoose(&sel)
	}
	t.lock(p)
	if err == nil && !e.stillChoosable(p, &sel, c, s, w) {
		// The chosen rank changed meanwhile: choose again on what is
		// true now, with the lock held.
		t.timing.Rechosen = true
		p.snapshot(w, c.usesTaints())
		sel, err = e.choose(p, w, s, np, c)
	}
	if err != nil {
		t.unlock(p)
		if book {
			e.book.unclaim(id, req.Client, len(w.tracking))
		}
		buf.release()
		e.observe(&t)
		return nil, err
	}
	// What the response says of the chosen rank's load is read now.
	sel.potDec = sel.rs.decodeBlocks() + sel.newBlks
	resp := response(p, &sel, id)
	if !book {
		e.busy(&sel, resp, req.Advisory)
		t.unlock(p)
		e.observe(&t)
		if !req.Lean {
			fillDP(w, resp)
		}
		if id != "" {
			e.pending.insert(&pendingEntry{
				key: pendingKey{key, id}, rank: sel.rs.rank,
				blocks: slices.Clone(w.blocks), hashes: slices.Clone(w.tracking),
				isl: np.isl, prefill: sel.prefill, track: s.trackPrefill,
				expected: req.ExpectedOutputTokens, lora: req.LoraName, session: session,
			})
		}
		return resp, nil
	}
	b, err := e.book.bookLocked(p, sel.rs, id, session, req.Client, hashes, buf, np.isl, sel.prefill, s.trackPrefill, req.ExpectedOutputTokens)
	if err != nil {
		t.unlock(p)
		e.book.unclaim(id, req.Client, len(w.tracking))
		buf.release()
		e.observe(&t)
		return nil, err
	}
	e.busy(&sel, resp, false)
	t.unlock(p)
	e.observe(&t)
	if !req.Lean {
		fillDP(w, resp)
	}
	e.book.commit(id, b)
	if req.RecordOnAnswer {
		resp.record = e.deferRecord(key, sel.rs.rank, w)
	} else {
		e.recordBooking(key, sel.rs.rank, w)
	}
	isl, track := np.isl, s.trackPrefill
	resp.ISLTokens, resp.TrackPrefillTokens = &isl, &track
	if buf == nil {
		// A pooled buffer goes back when the booking is freed, which
		// may happen before the caller is done with the response.
		resp.SequenceHashes = hashes
		if hashes == nil {
			// A booking always names its hashes, none included, as
			// Dynamo's answer does; /select's answer has none.
			resp.SequenceHashes = Hashes{}
		}
	}
	return resp, nil
}

// reserve is CreateReservation: from the pending cache when only
// selection_id is given, or explicitly on worker_id/dp_rank.
func (e *selector) reserve(req *ReservationRequest) (*ReservationResponse, error) {
	if req.SelectionID == nil {
		return nil, errorf(KindUnprocessable, "missing field `selection_id`")
	}
	if err := checkSelectionID(*req.SelectionID); err != nil {
		return nil, err
	}
	if *req.SelectionID == "" {
		// No route names an empty id: its booking could not be freed,
		// and would hold its rank's load until reservation_ttl.
		return nil, errorf(KindBadRequest, "selection_id must not be empty")
	}
	session := req.Placement.session()
	if err := checkSession(session); err != nil {
		return nil, err
	}
	if err := checkPartition(req.Partition.Key()); err != nil {
		return nil, err
	}
	if req.WorkerID != nil {
		return e.explicitReservation(req, session)
	}
	return e.cachedReservation(req, session)
}

func (e *selector) cachedReservation(req *ReservationRequest, session string) (*ReservationResponse, error) {
	id, key := *req.SelectionID, req.Partition.Key()
	pk := pendingKey{key, id}
	pe := e.pending.peek(pk)
	if pe == nil {
		return nil, errorf(KindNotFound, "no pending selection %s for %s (expired, already used, or never selected)", id, key)
	}
	if session == "" {
		session = pe.session
	}
	if err := e.book.claim(id, req.Client, len(pe.hashes)); err != nil {
		return nil, err
	}
	p := e.catalog.partition(key)
	if p == nil {
		e.book.unclaim(id, req.Client, len(pe.hashes))
		return nil, errorf(KindNotFound, "pending selection %s targets worker %d dp_rank %d, which is no longer schedulable", id, pe.rank.WorkerID, pe.rank.DPRank)
	}
	hashes := slices.Clone(pe.hashes)
	p.mu.Lock()
	rs := p.byRank[pe.rank]
	if rs == nil {
		p.mu.Unlock()
		e.book.unclaim(id, req.Client, len(pe.hashes))
		return nil, errorf(KindNotFound, "pending selection %s targets worker %d dp_rank %d, which is no longer schedulable", id, pe.rank.WorkerID, pe.rank.DPRank)
	}
	b, err := e.book.bookLocked(p, rs, id, session, req.Client, hashes, nil, pe.isl, pe.prefill, pe.track, pe.expected)
	endpoint := rs.endpoint
	p.mu.Unlock()
	if err != nil {
		e.book.unclaim(id, req.Client, len(pe.hashes))
		if StatusOf(err) == 400 {
			e.pending.discard(pk) // a hard-affinity refusal consumes the entry
		}
		return nil, err
	}
	e.book.commit(id, b)
	e.pending.remove(pk, pe.generation)
	if e.recorder != nil {
		e.recorder.RecordBooking(key, rs.rank, pe.blocks)
	}
	return &ReservationResponse{SelectionID: id, ModelName: key.Model, RoutingGroup: key.Group,
		WorkerID: rs.rank.WorkerID, DPRank: rs.rank.DPRank, Endpoint: endpoint}, nil
}

func (e *selector) explicitReservation(req *ReservationRequest, session string) (*ReservationResponse, error) {
	id, key := *req.SelectionID, req.Partition.Key()
	s, err := e.cfg.get().scoring(req.RouterConfigOverride)
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
	} else if wr, ok := e.catalog.Worker(rank.WorkerID); ok {
		rank.DPRank = wr.DataParallelStartRank
	}
	notSchedulable := errorf(KindNotFound, "worker %d dp_rank %d is not schedulable in %s", rank.WorkerID, rank.DPRank, key)
	p := e.catalog.partition(key)
	if p == nil {
		return nil, notSchedulable
	}
	w := getWork()
	defer putWork(w)
	np, err := normalize(&req.Prompt, p, &s, w, false)
	if err != nil {
		return nil, err
	}
	if ep := req.EffectivePrefillTokens; ep != nil && *ep > np.isl {
		return nil, errorf(KindBadRequest, "effective_prefill_tokens (%d) must not exceed isl_tokens (%d)", *ep, np.isl)
	}
	prefill := np.isl
	if req.EffectivePrefillTokens != nil {
		prefill = *req.EffectivePrefillTokens
	} else if np.hasBlocks {
		e.index.FindMatches(key, w.blocks, &w.matches)
		for _, m := range w.matches.List {
			if m.Rank == rank {
				prefill = effectivePrefill(np.isl, s.cachedTokens(m.Tiers, p.blockSize))
			}
		}
	}
	if err := e.book.claim(id, req.Client, len(w.tracking)); err != nil {
		return nil, err
	}
	e.pending.discard(pendingKey{key, id})
	hashes := slices.Clone(w.tracking)
	p.mu.Lock()
	rs := p.byRank[rank]
	if rs == nil {
		p.mu.Unlock()
		e.book.unclaim(id, req.Client, len(w.tracking))
		return nil, notSchedulable
	}
	b, err := e.book.bookLocked(p, rs, id, session, req.Client, hashes, nil, np.isl, prefill, track, req.ExpectedOutputTokens)
	endpoint := rs.endpoint
	p.mu.Unlock()
	if err != nil {
		e.book.unclaim(id, req.Client, len(w.tracking))
		return nil, err
	}
	e.book.commit(id, b)
	if e.recorder != nil && np.hasBlocks {
		e.recorder.RecordBooking(key, rank, w.blocks)
	}
	return &ReservationResponse{SelectionID: id, ModelName: key.Model, RoutingGroup: key.Group,
		WorkerID: rank.WorkerID, DPRank: rank.DPRank, Endpoint: endpoint}, nil
}
