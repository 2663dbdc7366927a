package indexer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// The KV events a worker publishes, decoded from either of vLLM's
// encodings (spec kv-events.md §1.5): positional arrays
// ["BlockStored", hashes, parent, tokens, …] or tagged maps
// {"type": "BlockStored", "block_hashes": …}, inside a batch that is an
// array [ts, events, dp_rank?] or a map {ts, events, data_parallel_rank}.

// Kind is an event's type.
type Kind uint8

// The event kinds.
const (
	Stored Kind = iota + 1
	Removed
	Cleared
)

// Tier is where a block lives, from the event's medium.
type Tier uint8

// The storage tiers, best first.
const (
	Device Tier = iota
	Host
	Disk
	External
)

// tierOf maps a medium to a tier; ok is false for a medium we do not know
// (such events are dropped rather than guessed at).
func tierOf(medium []byte) (Tier, bool) {
	switch string(medium) {
	case "", "GPU", "DEVICE", "gpu", "device":
		return Device, true
	case "CPU", "CPU_PINNED", "CPU_TIER1", "cpu", "cpu_pinned":
		return Host, true
	case "CPU_TIER2", "DISK", "NVME", "STORAGE", "disk":
		return Disk, true
	case "EXTERNAL", "NETWORK", "REMOTE", "SHARED", "external":
		return External, true
	}
	return 0, false
}

// Event is one decoded event. Slices alias the Decoder's buffers and are
// valid until its next Decode.
type Event struct {
	Kind        Kind
	BlockHashes []uint64 // engine hashes, opaque ids
	ParentHash  uint64
	HasParent   bool
	TokenIDs    []uint32
	// Eagle is set when token_ids came as bigram pairs.
	Eagle     bool
	BlockSize int
	Tier      Tier
	LoraName  string
	CacheSalt string
	// Skip is set for events the index must ignore: another attention
	// group (sliding window, Mamba), an unknown medium, remote locality.
	Skip bool
}

// Batch is one decoded message payload.
type Batch struct {
	TS     float64
	Events []Event
	// DPRank is the payload's data-parallel rank, or -1 when absent.
	DPRank int64
}

// Decoder decodes payloads, reusing its buffers from one batch to the next.
type Decoder struct {
	events []Event
	hashes []uint64
	tokens []uint32
}

// ErrPayload wraps every decoding failure.
var ErrPayload = errors.New("malformed KV event payload")

// Decode parses one payload. On error nothing of the batch is usable.
func (d *Decoder) Decode(payload []byte) (*Batch, error) {
	b, err := d.decode(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPayload, err)
	}
	return b, nil
}

func (d *Decoder) decode(payload []byte) (*Batch, error) {
	d.events, d.hashes, d.tokens = d.events[:0], d.hashes[:0], d.tokens[:0]
	r := &reader{b: payload}
	batch := &Batch{DPRank: -1}
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	switch {
	case isArray(c):
		n, err := r.arrayLen()
		if err != nil {
			return nil, err
		}
		if n < 2 {
			return nil, fmt.Errorf("batch array of %d elements", n)
		}
		if batch.TS, err = r.float(); err != nil {
			return nil, err
		}
		if err := d.events_(r); err != nil {
			return nil, err
		}
		if n >= 3 {
			if batch.DPRank, err = optRank(r); err != nil {
				return nil, err
			}
		}
		for range n - min(n, 3) {
			if err := r.skip(0); err != nil {
				return nil, err
			}
		}
	case isMap(c):
		n, err := r.mapLen()
		if err != nil {
			return nil, err
		}
		seen := false
		for range n {
			k, err := r.str()
			if err != nil {
				return nil, err
			}
			switch string(k) {
			case "ts":
				batch.TS, err = r.float()
			case "events":
				err, seen = d.events_(r), true
			case "data_parallel_rank", "dp_rank":
				batch.DPRank, err = optRank(r)
			default:
				err = r.skip(0)
			}
			if err != nil {
				return nil, err
			}
		}
		if !seen {
			return nil, errors.New("batch map without events")
		}
	default:
		return nil, fmt.Errorf("batch is neither array nor map (0x%02x)", c)
	}
	if r.i != len(r.b) {
		return nil, fmt.Errorf("%d trailing bytes", len(r.b)-r.i)
	}
	batch.Events = d.events
	return batch, nil
}

func optRank(r *reader) (int64, error) {
	if r.isNil() {
		return -1, nil
	}
	v, err := r.int64v()
	if err == nil && v < 0 {
		err = fmt.Errorf("negative dp_rank %d", v)
	}
	return v, err
}

// events_ reads the events array, appending to d.events.
func (d *Decoder) events_(r *reader) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	for range n {
		c, err := r.peek()
		if err != nil {
			return err
		}
		var ev Event
		if isMap(c) {
			err = d.mapEvent(r, &ev)
		} else {
			err = d.arrayEvent(r, &ev)
		}
		if err != nil {
			return err
		}
		d.events = append(d.events, ev)
	}
	return nil
}

func kindOf(tag []byte) (Kind, error) {
	switch string(tag) {
	case "BlockStored", "BlockStoredWithMetadata":
		return Stored, nil
	case "BlockRemoved":
		return Removed, nil
	case "AllBlocksCleared":
		return Cleared, nil
	}
	return 0, fmt.Errorf("unknown event type %q", tag)
}

// Field readers shared by both encodings. Each reads one value.

func (d *Decoder) readHashes(r *reader, ev *Event) error {
	if r.isNil() {
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	start := len(d.hashes)
	for range n {
		h, err := r.hash()
		if err != nil {
			return err
		}
		d.hashes = append(d.hashes, h)
	}
	ev.BlockHashes = d.hashes[start:len(d.hashes):len(d.hashes)]
	return nil
}

func (d *Decoder) readParent(r *reader, ev *Event) (err error) {
	if r.isNil() {
		return nil
	}
	ev.ParentHash, err = r.hash()
	ev.HasParent = err == nil
	return err
}

// readTokens reads token ids; bigram pairs [[a,b],[b,c],…] (vLLM's Eagle
// form) become a, b, c, … and mark the event as Eagle.
func (d *Decoder) readTokens(r *reader, ev *Event) error {
	if r.isNil() {
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	start := len(d.tokens)
	d.tokens = slices.Grow(d.tokens, n)
	// Fast path: a run of the unsigned encodings msgpack writers use for
	// token ids, read in place with local indexes; anything else (bigram
	// pairs, signed encodings, errors) leaves it for the careful loop.
	b, i := r.b, r.i
	out := d.tokens[start : start+n]
	k := 0
	for ; k < n && i+5 <= len(b); k++ {
		c := b[i]
		if c <= 0x7f {
			out[k] = uint32(c)
			i++
		} else if c == 0xce {
			out[k] = binary.BigEndian.Uint32(b[i+1 : i+5])
			i += 5
		} else if c == 0xcd {
			out[k] = uint32(binary.BigEndian.Uint16(b[i+1 : i+3]))
			i += 3
		} else if c == 0xcc {
			out[k] = uint32(b[i+1])
			i += 2
		} else {
			break
		}
	}
	r.i = i
	d.tokens = d.tokens[:start+k]
	for ; k < n; k++ {
		if i := r.i; i < len(b) {
			switch c := b[i]; {
			case c <= 0x7f:
				d.tokens = append(d.tokens, uint32(c))
				r.i++
				continue
			case c == 0xcd && i+3 <= len(b):
				d.tokens = append(d.tokens, uint32(binary.BigEndian.Uint16(b[i+1:i+3])))
				r.i += 3
				continue
			case c == 0xce && i+5 <= len(b):
				d.tokens = append(d.tokens, binary.BigEndian.Uint32(b[i+1:i+5]))
				r.i += 5
				continue
			case c == 0xcc && i+2 <= len(b):
				d.tokens = append(d.tokens, uint32(b[i+1]))
				r.i += 2
				continue
			}
		}
		c, err := r.peek()
		if err != nil {
			return err
		}
		if isArray(c) {
			m, err := r.arrayLen()
			if err != nil || m != 2 {
				return fmt.Errorf("token bigram %d of %d elements: %v", k, m, err)
			}
			a, err := tokenValue(r)
			if err != nil {
				return err
			}
			b, err := tokenValue(r)
			if err != nil {
				return err
			}
			if k == 0 {
				d.tokens = append(d.tokens, a)
			}
			d.tokens = append(d.tokens, b)
			ev.Eagle = true
			continue
		}
		t, err := tokenValue(r)
		if err != nil {
			return err
		}
		d.tokens = append(d.tokens, t)
	}
	ev.TokenIDs = d.tokens[start:len(d.tokens):len(d.tokens)]
	return nil
}

func tokenValue(r *reader) (uint32, error) {
	v, err := r.int64v()
	if err != nil {
		return 0, err
	}
	if v < 0 || v > 0xFFFFFFFF {
		return 0, fmt.Errorf("token id %d out of range", v)
	}
	return uint32(v), nil
}

func readOptInt(r *reader) (int64, bool, error) {
	if r.isNil() {
		return 0, false, nil
	}
	v, err := r.int64v()
	return v, err == nil, err
}

func readOptStr(r *reader) ([]byte, error) {
	if r.isNil() {
		return nil, nil
	}
	return r.str()
}

// readLora reads lora_name: a string, nil, or SGLang's {cache_salt: …} map.
func readLora(r *reader, ev *Event) error {
	c, err := r.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		return readSaltMap(r, ev)
	}
	s, err := readOptStr(r)
	ev.LoraName = string(s)
	return err
}

func readSaltMap(r *reader, ev *Event) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	for range n {
		k, err := r.str()
		if err != nil {
			return err
		}
		if string(k) == "cache_salt" {
			s, err := readOptStr(r)
			if err != nil {
				return err
			}
			ev.CacheSalt = string(s)
			continue
		}
		if err := r.skip(0); err != nil {
			return err
		}
	}
	return nil
}

func readMedium(r *reader, ev *Event) error {
	m, err := readOptStr(r)
	if err != nil {
		return err
	}
	t, ok := tierOf(m)
	ev.Tier = t
	if !ok {
		ev.Skip = true
	}
	return nil
}

// readGroup applies group_idx: only group 0 is indexed.
func readGroup(r *reader, ev *Event) error {
	g, ok, err := readOptInt(r)
	if ok && g != 0 {
		ev.Skip = true
	}
	return err
}

// readSpecKind applies kv_cache_spec_kind: only full-attention groups are indexed.
func readSpecKind(r *reader, ev *Event) error {
	k, err := readOptStr(r)
	switch string(k) {
	case "", "full_attention", "mla_attention", "sink_full_attention":
	default:
		ev.Skip = true
	}
	return err
}

func readLocality(r *reader, ev *Event) error {
	l, err := readOptStr(r)
	switch string(l) {
	case "", "LOCAL", "local":
	default:
		ev.Skip = true
	}
	return err
}

// arrayEvent reads the positional form, tolerant of any arity: trailing
// fields may be absent and unknown ones are skipped.
func (d *Decoder) arrayEvent(r *reader, ev *Event) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.New("empty event array")
	}
	tag, err := r.str()
	if err != nil {
		return err
	}
	if ev.Kind, err = kindOf(tag); err != nil {
		return err
	}
	var fields []func(*reader, *Event) error
	switch ev.Kind {
	case Stored:
		fields = []func(*reader, *Event) error{
			d.readHashes, d.readParent, d.readTokens,
			func(r *reader, ev *Event) error {
				bs, _, err := readOptInt(r)
				ev.BlockSize = int(bs)
				return err
			},
			func(r *reader, _ *Event) error { return r.skip(0) }, // lora_id (deprecated)
			readMedium, readLora,
			func(r *reader, _ *Event) error { return r.skip(0) }, // extra_keys
		}
	case Removed:
		fields = []func(*reader, *Event) error{d.readHashes, readMedium}
	}
	k := 1
	for ; k < n && k-1 < len(fields); k++ {
		if err := fields[k-1](r, ev); err != nil {
			return err
		}
	}
	// The tail after the fixed fields, in order: group_idx,
	// kv_cache_spec_kind, the sliding window, locality. Dynamo's encoder
	// puts block_mm_infos (an array) first; SGLang's salted stores end with
	// a {cache_salt} map.
	pos := 0
	for ; k < n; k++ {
		c, err := r.peek()
		if err != nil {
			return err
		}
		switch {
		case isMap(c):
			err = readSaltMap(r, ev)
		case isArray(c) && pos == 0:
			err = r.skip(0)
		default:
			switch pos {
			case 0:
				err = readGroup(r, ev)
			case 1:
				err = readSpecKind(r, ev)
			case 3:
				err = readLocality(r, ev)
			default:
				err = r.skip(0)
			}
			pos++
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// mapEvent reads the tagged-map form by key name; unknown keys are skipped.
func (d *Decoder) mapEvent(r *reader, ev *Event) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	for range n {
		key, err := r.str()
		if err != nil {
			return err
		}
		switch string(key) {
		case "type":
			tag, err := r.str()
			if err != nil {
				return err
			}
			if ev.Kind, err = kindOf(tag); err != nil {
				return err
			}
		case "block_hashes":
			err = d.readHashes(r, ev)
		case "parent_block_hash":
			err = d.readParent(r, ev)
		case "token_ids":
			err = d.readTokens(r, ev)
		case "block_size":
			var bs int64
			bs, _, err = readOptInt(r)
			ev.BlockSize = int(bs)
		case "medium":
			err = readMedium(r, ev)
		case "lora_name":
			err = readLora(r, ev)
		case "metadata":
			err = readSaltMap(r, ev)
		case "group_idx":
			err = readGroup(r, ev)
		case "kv_cache_spec_kind":
			err = readSpecKind(r, ev)
		case "locality":
			err = readLocality(r, ev)
		default:
			err = r.skip(0)
		}
		if err != nil {
			return err
		}
	}
	if ev.Kind == 0 {
		return errors.New("event map without type")
	}
	return nil
}
