package indexer

import (
	"errors"
	"fmt"
)

// Decoding a payload, in either of vLLM's encodings (docs/kv-events.md §4):
// positional arrays ["BlockStored", hashes, parent, tokens, …] or tagged
// maps {"type": "BlockStored", "block_hashes": …}, inside a batch that is an
// array [ts, events, dp_rank?] or a map {ts, events, data_parallel_rank}.

// Decoder decodes payloads, reusing its buffers from one batch to the next.
type Decoder struct {
	batch  Batch // the batch Decode returns, so decoding allocates nothing
	events []Event
	hashes []uint64
	tokens []uint32
}

// What a decoder keeps between payloads: past these, a payload's scratch
// is dropped once its batch has been applied (Shed). An engine's step
// needs far less (tens of events, a few thousand tokens); a publisher
// whose 4 MiB messages carry 4M one-byte tokens or hashes left each of
// its listeners holding about 90 MB for good.
const (
	keepEvents = 1 << 10
	keepHashes = 16 << 10
	keepTokens = 64 << 10
)

// Shed drops scratch that a large payload grew past what is kept, with
// the batch and events that point into it. The last batch Decode returned
// must no longer be in use.
func (d *Decoder) Shed() {
	if cap(d.events) <= keepEvents && cap(d.hashes) <= keepHashes && cap(d.tokens) <= keepTokens {
		return
	}
	if cap(d.events) > keepEvents {
		d.events = nil
	} else {
		clear(d.events[:cap(d.events)]) // their slices point into the dropped scratch
	}
	if cap(d.hashes) > keepHashes {
		d.hashes = nil
	}
	if cap(d.tokens) > keepTokens {
		d.tokens = nil
	}
	d.batch = Batch{}
}

// The most events, and block hashes over all its events, one payload
// may carry; a payload past either is malformed. An engine's step makes
// far fewer (a 16k-token prefill chunk is 1,024 blocks of 16 tokens, or
// 16,384 one-page events from SGLang at page size 1, its most), and a
// payload is applied whole in one turn of its ingest loop: 4 MiB of the
// events that cost most to apply (97k parentless stores, or 4M one-byte
// hashes to remove) held every other publisher of the loop for 0.3 s a
// message (RELIABILITY.md).
const (
	maxEventsPerPayload = 1 << 15
	maxHashesPerPayload = 1 << 16
)

// ErrPayload wraps every decoding failure.
var ErrPayload = errors.New("malformed KV event payload")

// Decode parses one payload. On error nothing of the batch is usable. The
// batch, like the slices of its events, is the decoder's and valid until
// its next Decode.
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
	d.batch = Batch{DPRank: -1}
	batch := &d.batch
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
		if err := d.readEvents(r); err != nil {
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
				err, seen = d.readEvents(r), true
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

// optRank reads a batch's dp_rank: -1 when nil, an error when negative
// (docs/kv-events.md §6).
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

// readEvents reads the events array, appending to d.events.
func (d *Decoder) readEvents(r *reader) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if len(d.events)+n > maxEventsPerPayload {
		return fmt.Errorf("more than %d events", maxEventsPerPayload)
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
		if err == nil && ev.extraKeys != nil {
			err = d.settleExtraKeys(&ev)
		}
		if err != nil {
			return err
		}
		d.events = append(d.events, ev)
	}
	return nil
}

// kindOf maps an event's type name to its kind; SGLang's salted stores
// are stores.
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
	// The fixed fields by position, read by a switch (a table of method
	// values cost an allocation per event).
	fixed := 0
	switch ev.Kind {
	case Stored:
		fixed = 8
	case Removed:
		fixed = 2
	}
	k := 1
	for ; k < n && k-1 < fixed; k++ {
		if err := d.fixedField(r, ev, k-1); err != nil {
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

// fixedField reads the positional field i (after the tag) of a store or
// removal: a store's hashes, parent, tokens, block_size, lora_id
// (deprecated), medium, lora_name and extra_keys; a removal's hashes and
// medium.
func (d *Decoder) fixedField(r *reader, ev *Event, i int) error {
	if ev.Kind == Removed {
		if i == 0 {
			return d.readHashes(r, ev)
		}
		return readMedium(r, ev)
	}
	switch i {
	case 0:
		return d.readHashes(r, ev)
	case 1:
		return d.readParent(r, ev)
	case 2:
		return d.readTokens(r, ev)
	case 3:
		return readBlockSize(r, ev)
	case 5:
		return readMedium(r, ev)
	case 6:
		return readLora(r, ev)
	case 7:
		return readExtraKeys(r, ev)
	}
	return r.skip(0) // lora_id
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
			err = readBlockSize(r, ev)
		case "medium":
			err = readMedium(r, ev)
		case "lora_name":
			err = readLora(r, ev)
		case "extra_keys":
			err = readExtraKeys(r, ev)
		case "metadata":
			err = readSaltMap(r, ev)
		case "cache_salt":
			// SGLang's map-form store names its salt at the top level
			// (and a session_id, skipped below).
			var s []byte
			s, err = readOptStr(r)
			ev.CacheSalt = string(s)
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
