package selection

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"
)

// bookings is the reservation table: every booking by selection id, and
// the live bookings per client (Config.MaxReservationsPerClient). An id
// goes through claim (reserved, booking in flight), then commit (the
// booking stored) or unclaim (the booking failed); take removes a
// committed booking exactly once, so a booking's load is released
// exactly once whoever frees it (Free, the stale sweep, forgetServer).
type bookings struct {
	cfg      *liveConfig
	now      func() time.Time
	affinity *affinityTable // session leases held by bookings; nil when off
	replica  replicaOut     // tells the other replicas (replica.go); empty without

	mu           sync.Mutex
	reservations map[string]*booking    // nil value: claimed, booking in flight
	clients      map[string]clientHolds // live and claimed bookings per client
}

// clientHolds is what one client's live and claimed bookings hold: how
// many, and the prompt blocks they cover (each block a tracking hash the
// booking keeps, and its share of the partition's load trie).
type clientHolds struct{ bookings, blocks int }

func newBookings(cfg *liveConfig, now func() time.Time, affinity *affinityTable) *bookings {
	return &bookings{cfg: cfg, now: now, affinity: affinity,
		reservations: make(map[string]*booking), clients: make(map[string]clientHolds)}
}

// bookingSweepEvery is how often stale bookings are swept: every 30
// seconds, or twice per ReservationTTL when that is shorter.
func bookingSweepEvery(ttl time.Duration) time.Duration {
	every := 30 * time.Second
	if ttl > 0 && ttl/2 < every {
		every = max(ttl/2, 10*time.Millisecond)
	}
	return every
}

// sweep frees stale bookings and drops idle session bindings. It returns
// the number of bookings freed.
func (t *bookings) sweep() int {
	var stale []string
	if t.cfg.get().ReservationTTL > 0 {
		cutoff := t.now().Add(-t.cfg.get().ReservationTTL)
		t.mu.Lock()
		for id, b := range t.reservations {
			if b != nil && b.createdAt.Before(cutoff) {
				stale = append(stale, id)
			}
		}
		t.mu.Unlock()
	}
	for _, id := range stale {
		_ = t.free(id)
	}
	if t.affinity.enabled() {
		t.affinity.sweep()
	}
	return len(stale)
}

// active is the number of live bookings.
func (t *bookings) active() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, b := range t.reservations {
		if b != nil {
			n++
		}
	}
	return n
}

// newSelectionID returns a random UUIDv4.
func newSelectionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	// 8-4-4-4-12 lowercase hex digits, written out: one allocation where
	// fmt's formatting of five slices made six, on every proxied request.
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	hex.Encode(out[9:13], b[4:6])
	hex.Encode(out[14:18], b[6:8])
	hex.Encode(out[19:23], b[8:10])
	hex.Encode(out[24:36], b[10:16])
	out[8], out[13], out[18], out[23] = '-', '-', '-', '-'
	return string(out[:])
}

// claim reserves a selection id globally (ids are unique across
// partitions) and counts it, a booking of blocks prompt blocks, against
// client's bounds.
func (t *bookings) claim(id, client string, blocks int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.reservations[id]; ok {
		return errorf(KindConflict, "selection %s is already reserved or being reserved", id)
	}
	if client != "" {
		cfg, h := t.cfg.get(), t.clients[client]
		if limit := cfg.MaxReservationsPerClient; limit > 0 && h.bookings >= limit {
			return errorf(KindOverloaded, "client %s holds %d reservations, the most max_reservations_per_client allows; free them (DELETE /reservations/{id}) or wait for them to expire",
				client, limit)
		}
		if limit := cfg.MaxReservationBlocksPerClient; limit > 0 && h.blocks+blocks > limit {
			return errorf(KindOverloaded, "client %s's reservations cover %d prompt blocks, and this one's %d would pass the %d max_reservation_blocks_per_client allows; free them (DELETE /reservations/{id}) or wait for them to expire",
				client, h.blocks, blocks, limit)
		}
		t.clients[client] = clientHolds{h.bookings + 1, h.blocks + blocks}
	}
	t.reservations[id] = nil
	return nil
}

// commit stores the booking under its claimed id. b.client must be the
// client the id was claimed for.
func (t *bookings) commit(id string, b *booking) {
	t.replica.reserved(b)
	t.mu.Lock()
	t.reservations[id] = b
	t.mu.Unlock()
}

// unclaim gives back a claim (of blocks prompt blocks) whose booking
// failed.
func (t *bookings) unclaim(id, client string, blocks int) {
	t.mu.Lock()
	if b, ok := t.reservations[id]; ok && b == nil {
		delete(t.reservations, id)
		t.uncountLocked(client, blocks)
	}
	t.mu.Unlock()
}

// takeLocked removes a committed booking from the table and its client's
// count; t.mu must be held. The caller releases its load.
func (t *bookings) takeLocked(id string) *booking {
	b := t.reservations[id]
	if b != nil {
		delete(t.reservations, id)
		t.uncountLocked(b.client, b.blocks)
	}
	return b
}

// uncountLocked takes a booking of blocks prompt blocks off client's
// holds. Holds are counted whatever the bounds are, so that a bound set
// by a reload counts the bookings made before it.
func (t *bookings) uncountLocked(client string, blocks int) {
	if client == "" {
		return
	}
	h := t.clients[client]
	if h.bookings <= 1 {
		delete(t.clients, client)
		return
	}
	t.clients[client] = clientHolds{h.bookings - 1, h.blocks - blocks}
}

// lookup returns a committed booking; in-flight and unknown ids are not
// found.
func (t *bookings) lookup(id string) (*booking, error) {
	t.mu.Lock()
	b := t.reservations[id]
	t.mu.Unlock()
	if b == nil {
		return nil, errorf(KindNotFound, "reservation %s not found", id)
	}
	return b, nil
}

// prefillComplete marks the booking's prefill done (idempotent).
func (t *bookings) prefillComplete(id string) error {
	err := t.onLive(id, func(b *booking) { b.part.load.prefillComplete(b) })
	if err == nil {
		t.replica.prefillCompleted(id)
	}
	return err
}

// outputBlock adds one output block to the booking's rank.
func (t *bookings) outputBlock(id string, decayFraction *float64) error {
	if d := decayFraction; d != nil && !(*d >= 0 && *d <= 1) {
		return errorf(KindBadRequest, "decay_fraction must be between 0.0 and 1.0")
	}
	track := t.cfg.get().TrackActiveBlocks
	err := t.onLive(id, func(b *booking) { b.part.load.outputBlock(b, decayFraction, track) })
	if err == nil {
		t.replica.outputBlock(id, decayFraction)
	}
	return err
}

// onLive runs fn on booking id under its partition's lock, unless the
// booking was freed meanwhile (a free racing a prefill report is not an
// error: the report just comes too late).
func (t *bookings) onLive(id string, fn func(b *booking)) error {
	b, err := t.lookup(id)
	if err != nil {
		return err
	}
	p := b.part
	p.mu.Lock()
	if !b.freed {
		fn(b)
	}
	p.mu.Unlock()
	return nil
}

// free releases a booking: prefill tokens, blocks and the request count.
func (t *bookings) free(id string) error {
	t.mu.Lock()
	b := t.takeLocked(id)
	t.mu.Unlock()
	if b == nil {
		return errorf(KindNotFound, "reservation %s not found", id)
	}
	t.release(b)
	return nil
}

// forgetWorker takes out and releases every booking on a worker's ranks.
func (t *bookings) forgetWorker(id uint64) {
	var gone []*booking
	t.mu.Lock()
	for sid, b := range t.reservations {
		if b != nil && b.rs.rank.WorkerID == id {
			gone = append(gone, t.takeLocked(sid))
		}
	}
	t.mu.Unlock()
	for _, b := range gone {
		t.release(b)
	}
}

// release gives back the load and session lease of a booking already taken
// out of t.reservations.
func (t *bookings) release(b *booking) {
	p := b.part
	p.mu.Lock()
	p.load.free(b, t.cfg.get().TrackActiveBlocks)
	p.mu.Unlock()
	t.replica.freed(b.id)
	if b.session != "" && t.affinity.enabled() {
		t.affinity.release(sessionKey{b.key, b.session}, b.lease)
	}
}

// bookLocked books a request on rs; p.mu must be held. A rank at
// MaxReservationsPerRank is refused. With a session and affinity on, it
// takes the session's lease first (and may refuse). The booking keeps
// hashes: the caller passes its own copy, made before it took p.mu (a
// 99k-token prompt's is 48 KiB, too much to copy under the lock), and buf
// when that copy is a pooled buffer (hashbuf.go), whose hold passes to the
// booking; on a refusal the caller keeps both.
func (t *bookings) bookLocked(p *partition, rs *rankState, id, session, client string, hashes []uint64, buf *hashBuf,
	isl, prefill uint64, track bool, expected *uint32) (*booking, error) {
	if rs.full(t.cfg.get()) {
		return nil, errorf(KindNotReady, "worker %d dp_rank %d holds %d reservations, the most max_reservations_per_rank allows",
			rs.rank.WorkerID, rs.rank.DPRank, t.cfg.get().MaxReservationsPerRank)
	}
	var lease *binding
	if session != "" && t.affinity.enabled() {
		var err error
		if lease, err = t.affinity.acquire(sessionKey{p.key, session}, rs.rank); err != nil {
			return nil, err
		}
	}
	b := &booking{id: id, key: p.key, part: p, rs: rs, hashes: hashes, buf: buf,
		isl: isl, expected: expected, client: client, blocks: len(hashes), createdAt: t.now(), lease: lease}
	if lease != nil {
		b.session = session
	}
	if track {
		b.prefill = prefill
	}
	p.load.add(b, t.cfg.get().TrackActiveBlocks)
	return b, nil
}
