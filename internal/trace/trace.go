// Package trace reads request traces in the Mooncake format, which `kvbench replay` plays
// through a gateway and kvsim simulates. A trace is JSON Lines (optionally gzipped): one
// object per request with
//
//	timestamp      its arrival, in milliseconds from the trace's start
//	input_length   its prompt's length in tokens
//	output_length  the tokens it generated
//	hash_ids       its prompt as a list of block ids, one per block of
//	               blockTokens tokens (512 in the published traces); two
//	               prompts whose ids agree at a position have the same
//	               content there, and the last id stands for what remains
//	               of input_length, which may be a partial block
//
// The trace holds no text: Tokens makes token ids from the block ids,
// so that equal ids give equal tokens and the engines' prefix caches see
// exactly the reuse the trace describes.
package trace

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"
)

// Request is one line of a trace.
type Request struct {
	// Line is the request's line number in the file (from 1).
	Line    int
	Arrival time.Duration
	Input   int
	Output  int
	Blocks  []int64
}

// line is a line as written; pointers tell a missing field from a
// zero.
type line struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// parseLine checks one line and turns it into a request.
func parseLine(b []byte, blockTokens int) (Request, error) {
	var l line
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&l); err != nil {
		return Request{}, err
	}
	if dec.More() {
		return Request{}, errors.New("more than one JSON value")
	}
	switch {
	case l.Timestamp == nil:
		return Request{}, errors.New("no timestamp")
	case *l.Timestamp < 0:
		return Request{}, fmt.Errorf("timestamp %v is negative", *l.Timestamp)
	case l.InputLength == nil:
		return Request{}, errors.New("no input_length")
	case *l.InputLength < 1:
		return Request{}, fmt.Errorf("input_length %d is below 1", *l.InputLength)
	case l.OutputLength == nil:
		return Request{}, errors.New("no output_length")
	case *l.OutputLength < 0:
		return Request{}, fmt.Errorf("output_length %d is negative", *l.OutputLength)
	}
	if want := (*l.InputLength + blockTokens - 1) / blockTokens; len(l.HashIDs) != want {
		return Request{}, fmt.Errorf("input_length %d makes %d blocks of %d tokens, but hash_ids has %d",
			*l.InputLength, want, blockTokens, len(l.HashIDs))
	}
	for _, id := range l.HashIDs {
		if id < 0 {
			return Request{}, fmt.Errorf("hash id %d is negative", id)
		}
	}
	return Request{
		Arrival: time.Duration(*l.Timestamp * float64(time.Millisecond)),
		Input:   *l.InputLength,
		Output:  *l.OutputLength,
		Blocks:  l.HashIDs,
	}, nil
}

// Read reads a trace from r, gzipped or not (told by its first
// bytes, not by a file name). Blank lines are skipped; any other line that
// is not a valid request fails the whole read with its line number. The
// requests come back in arrival order (a stable sort: lines with the same
// timestamp keep the file's order).
func Read(r io.Reader, blockTokens int) ([]Request, error) {
	if blockTokens < 1 {
		return nil, fmt.Errorf("block size %d: must be at least 1 token", blockTokens)
	}
	br := bufio.NewReaderSize(r, 1<<16)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		br = bufio.NewReaderSize(zr, 1<<16)
	}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var out []Request
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		req, err := parseLine(b, blockTokens)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		req.Line = line
		out = append(out, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("after line %d: %w", line, err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Arrival < out[j].Arrival })
	return out, nil
}

// ReadFile is Read on a file.
func ReadFile(path string, blockTokens int) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reqs, err := Read(f, blockTokens)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return reqs, nil
}

// Vocab bounds the token ids made from a trace: below it, kvmock (and
// a Llama-3 tokenizer) treat every id as an ordinary token, never as a
// special one.
const Vocab = 128_000

// mix64 is SplitMix64's finalizer: a cheap bijection of 64-bit integers
// whose outputs look independent for nearby inputs.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// BlockToken is token i of the block whose id is id: a function of the
// two alone, so a block id stands for the same tokens wherever it occurs.
func BlockToken(id int64, i int) uint32 { return TokenAt(MixID(id), i) }

// MixID is the part of BlockToken that depends on the block id alone, for
// callers that make a whole block's tokens.
func MixID(id int64) uint64 { return mix64(uint64(id)) }

// TokenAt is token i of the block whose MixID is base.
func TokenAt(base uint64, i int) uint32 { return uint32(mix64(base+uint64(i)) % Vocab) }

// Tokens is the prompt of r: blockTokens tokens per block id, the
// last block cut so that the prompt has r.Input tokens.
func Tokens(r Request, blockTokens int) []uint32 {
	out := make([]uint32, 0, r.Input)
	for _, id := range r.Blocks {
		n := min(blockTokens, r.Input-len(out))
		for i := range n {
			out = append(out, BlockToken(id, i))
		}
	}
	return out
}
