package indexer

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
)

// appendTokenAnyWidth appends id as a msgpack integer of a width chosen
// by pick among those that hold it, not only the shortest: writers differ,
// and readTokens' fast paths must read every form the careful loop reads.
func appendTokenAnyWidth(dst []byte, id uint32, pick int) []byte {
	type form struct {
		head byte
		size int // bytes after the head
		fits bool
	}
	forms := []form{
		{0, 0, id <= 0x7f}, // positive fixint: the head is the id
		{0xcc, 1, id <= 0xff},
		{0xcd, 2, id <= 0xffff},
		{0xce, 4, true},
		{0xcf, 8, true},
		{0xd0, 1, id <= 0x7f},
		{0xd1, 2, id <= 0x7fff},
		{0xd2, 4, id <= 0x7fffffff},
		{0xd3, 8, true},
	}
	var ok []form
	for _, f := range forms {
		if f.fits {
			ok = append(ok, f)
		}
	}
	f := ok[pick%len(ok)]
	if f.head == 0 {
		return append(dst, byte(id))
	}
	var be [8]byte
	binary.BigEndian.PutUint64(be[:], uint64(id))
	return append(append(dst, f.head), be[8-f.size:]...)
}

// TestDecodeTokenWidths decodes token ids in every integer form msgpack
// allows, mixed at random, in runs of every length up to 70, placed last
// in the payload so that the fast paths' bounds near its end are crossed
// too; what comes out must be what went in.
func TestDecodeTokenWidths(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	// Each mix draws ids from these ranges, so runs of one width, of the
	// two common widths (16 and 32 bits) and of all of them occur.
	mixes := [][]uint32{{0x7f}, {0xff}, {0xffff}, {0xffffffff}, {0xffff, 0xffffffff}, {0x7f, 0xff, 0xffff, 0xffffffff}}
	var d Decoder
	for trial := range 4000 {
		n := trial % 71
		mix := mixes[rng.IntN(len(mixes))]
		shortest := rng.IntN(2) == 0
		ids := make([]uint32, n)
		// [ts, [["BlockStored", [1], nil, [ids…]]]]: the ids end the payload.
		p := []byte{0x92, 0x00, 0x91, 0x94}
		p = appendStr(p, "BlockStored")
		p = append(p, 0x91, 0x01, 0xc0)
		p = appendArrayHeader(p, n)
		for i := range ids {
			top := mix[rng.IntN(len(mix))]
			ids[i] = uint32(rng.Uint64N(uint64(top) + 1))
			pick := 0
			if !shortest {
				pick = rng.IntN(9)
			}
			p = appendTokenAnyWidth(p, ids[i], pick)
		}
		b, err := d.Decode(p)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if got := b.Events[0].TokenIDs; !slices.Equal(got, ids) {
			t.Fatalf("trial %d (%d ids): decoded %v, want %v", trial, n, got, ids)
		}
		// Every cut of the payload short of its end is refused.
		if n > 0 {
			cut := len(p) - 1 - rng.IntN(min(len(p)-1, 12))
			if _, err := d.Decode(p[:cut]); err == nil {
				t.Fatalf("trial %d: a payload cut to %d of %d bytes decoded", trial, cut, len(p))
			}
		}
	}
}

// TestDecodeHashWidths decodes block hashes in the forms publishers use,
// mixed at random (full-width runs take readHashes' fast path, the rest
// r.hash), and checks each against the value written.
func TestDecodeHashWidths(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	var d Decoder
	for trial := range 2000 {
		n := trial % 40
		want := make([]uint64, n)
		p := []byte{0x92, 0x00, 0x91, 0x92}
		p = appendStr(p, "BlockRemoved")
		p = appendArrayHeader(p, n)
		for i := range want {
			v := rng.Uint64()
			var be [8]byte
			switch rng.IntN(5) {
			case 0: // a small id, shortest form
				v >>= 40
				p = appendTokenAnyWidth(p, uint32(v), 0)
			case 1: // uint64
				binary.BigEndian.PutUint64(be[:], v)
				p = append(append(p, 0xcf), be[:]...)
			case 2: // int64, the same bits
				binary.BigEndian.PutUint64(be[:], v)
				p = append(append(p, 0xd3), be[:]...)
			case 3: // 32 bytes of bin: the last eight count
				p = append(p, 0xc4, 32)
				for range 24 {
					p = append(p, byte(rng.IntN(256)))
				}
				binary.BigEndian.PutUint64(be[:], v)
				p = append(p, be[:]...)
			case 4: // uint32
				v &= 0xffffffff
				p = appendTokenAnyWidth(p, uint32(v), 3)
			}
			want[i] = v
		}
		b, err := d.Decode(p)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if got := b.Events[0].BlockHashes; !slices.Equal(got, want) && !(n == 0 && len(got) == 0) {
			t.Fatalf("trial %d: decoded %x, want %x", trial, got, want)
		}
	}
}
