package selection

import "sync"

// Pooled tracking hashes for the proxy's bookings. A booking keeps its
// prompt's tracking hashes until it is freed (load.go walks them to give
// its blocks back); for a 100k-token prompt they are 50 KB, which a fresh
// copy per booking made the largest allocation of a proxied request, and
// a large one: each goes to the heap's page allocator and adds to the
// collector's work. A booking made for the proxy (a lean request) copies
// them into a pooled buffer instead.
//
// The buffer is read by its booking and by the trie edges cut from it
// (load.go), and an edge can outlive the booking: a later booking of the
// same prefix keeps holding it. So the buffer counts its readers, under
// the partition's mutex, and goes back to the pool only when the last one
// lets go. Nothing outside the partition's trie and the booking ever sees
// it: a replica record (replica.go) gets a copy, and a lean response
// carries no sequence hashes.

// hashBuf is one booking's tracking hashes, shared read-only with the
// trie edges that hold slices of them.
type hashBuf struct {
	hashes []uint64
	// refs counts the booking (until it is freed) and the edges whose
	// hashes are slices of this buffer. It is only changed with the
	// partition's mutex held, once the booking is shared.
	refs int32
}

// maxPooledHashes is the largest buffer the pool keeps: 131,072 hashes
// (1 MiB), a 2M-token prompt at block size 16. A larger one, which only a
// raised body limit lets in, is left to the collector.
const maxPooledHashes = 1 << 17

var hashBufs = sync.Pool{New: func() any { return new(hashBuf) }}

// poisonFreedHashes, set by tests only, overwrites a buffer's hashes when
// its last reader lets go, so a reader that kept it too long reads garbage
// rather than a plausible prompt.
var poisonFreedHashes bool

// hashPoison is what a poisoned buffer holds.
const hashPoison = 0xdeadbeefdeadbeef

// newHashBuf copies hashes into a pooled buffer held once (by the booking
// about to be made).
func newHashBuf(hashes []uint64) *hashBuf {
	b := hashBufs.Get().(*hashBuf)
	b.hashes = append(b.hashes[:0], hashes...)
	b.refs = 1
	return b
}

// retain adds a reader. A nil buffer (hashes the collector owns) needs no
// counting.
func (b *hashBuf) retain() {
	if b != nil {
		b.refs++
	}
}

// release drops a reader; the last one gives the buffer back.
func (b *hashBuf) release() {
	if b == nil {
		return
	}
	b.refs--
	if b.refs != 0 {
		// Still held; or let go of more often than held, a bug the tests
		// catch (the counts no longer match the holders), in which case
		// the buffer is left to the collector rather than reused.
		return
	}
	if poisonFreedHashes {
		for i := range b.hashes {
			b.hashes[i] = hashPoison
		}
	}
	if cap(b.hashes) > maxPooledHashes {
		return
	}
	b.hashes = b.hashes[:0]
	hashBufs.Put(b)
}
