package indexer

import (
	"fmt"

	"github.com/zeebo/xxh3"
)

// A vLLM store's extra_keys (docs/kv-events.md §4): one entry per engine
// block, nil or an array of what vLLM hashed with that block's tokens, in
// its order: the LoRA name (every block of an adapter's request), one
// [identifier, offset] pair per multimodal item the block overlaps,
// cache_salt (the request's first block only) and a prompt-embeds digest
// (bytes). The engine names the salt nowhere else, so a salted request's
// blocks would otherwise be indexed as the unsalted prompt's: a salted
// request found none of its blocks, and an unsalted one was promised
// blocks it can never use. Multimodal and prompt-embeds inputs make a
// block's content more than its tokens (two images of one size give the
// same placeholder tokens); such a block is marked so that no prompt the
// gateway hashes from tokens alone can match it or anything after it.

// readExtraKeys keeps a store's extra_keys as sent, to be read by
// settleExtraKeys once the event's lora_name is known (a map event may
// give it later).
func readExtraKeys(r *reader, ev *Event) error {
	start := r.i
	if r.isNil() {
		return nil
	}
	if err := r.skip(0); err != nil {
		return err
	}
	ev.extraKeys = r.b[start:r.i]
	return nil
}

// settleExtraKeys reads ev's extra_keys: the first block's lone string
// besides the LoRA name, in a store with no parent, is the cache salt
// (unless the event gave one, as SGLang does); any other input marks its
// block (ev.Marks, in the decoder's hash scratch).
func (d *Decoder) settleExtraKeys(ev *Event) error {
	raw := ev.extraKeys
	ev.extraKeys = nil
	if ev.Kind != Stored {
		return nil
	}
	r := &reader{b: raw}
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("extra_keys: %w", err)
	}
	if n > len(ev.BlockHashes) {
		// One entry per block: more would only grow the scratch, eight
		// bytes for each byte of nils.
		return fmt.Errorf("extra_keys: %d entries for %d blocks", n, len(ev.BlockHashes))
	}
	start := len(d.hashes)
	marked := false
	for i := range n {
		rest, lone, err := blockKeys(r, ev.LoraName)
		if err != nil {
			return fmt.Errorf("extra_keys[%d]: %w", i, err)
		}
		var mark uint64
		switch {
		case len(rest) == 0:
		case i == 0 && !ev.HasParent && lone != nil:
			if ev.CacheSalt == "" {
				ev.CacheSalt = string(lone)
			}
		default:
			mark = xxh3.Hash(rest) | 1 // never 0, which is "no mark"
			marked = true
		}
		d.hashes = append(d.hashes, mark)
	}
	if marked {
		ev.Marks = d.hashes[start:len(d.hashes):len(d.hashes)]
	} else {
		d.hashes = d.hashes[:start]
	}
	return nil
}

// blockKeys reads one block's entry of extra_keys and returns its inputs
// besides a leading LoRA name (raw msgpack) and, when they are one string
// alone, that string.
func blockKeys(r *reader, lora string) (rest, lone []byte, err error) {
	if r.isNil() {
		return nil, nil, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, nil, err
	}
	from, strs, others := r.i, 0, 0
	for j := range n {
		c, err := r.peek()
		if err != nil {
			return nil, nil, err
		}
		if !isStr(c) {
			if err := r.skip(0); err != nil {
				return nil, nil, err
			}
			others++
			continue
		}
		s, err := r.str()
		if err != nil {
			return nil, nil, err
		}
		if j == 0 && lora != "" && string(s) == lora {
			from = r.i
			continue
		}
		lone, strs = s, strs+1
	}
	rest = r.b[from:r.i]
	if strs != 1 || others != 0 {
		lone = nil
	}
	return rest, lone, nil
}

// isStr reports whether c starts a msgpack string (not bin: a digest is
// bytes, and never a salt).
func isStr(c byte) bool { return c&0xe0 == 0xa0 || c == 0xd9 || c == 0xda || c == 0xdb }
