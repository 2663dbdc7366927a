package main

import (
	"bytes"
	"compress/gzip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// testdata/mini-trace.jsonl is a five-request trace in blocks of 4 tokens
// (the tests pass --block-tokens 4), with a blank fourth line:
//
//	line 1  t=0    10 tokens  ids 1 2 3  (the last block holds 2 tokens)
//	line 2  t=100  12 tokens  ids 1 2 4  (shares 1 2 with line 1)
//	line 3  t=200   8 tokens  ids 1 2    (all of it seen before)
//	line 5  t=300   6 tokens  ids 5 2    (2 after another first block: new)
//	line 6  t=400   9 tokens  ids 1 2 3  (line 1's chain; output_length 0)
const miniTrace = "testdata/mini-trace.jsonl"

func readMini(t *testing.T) []traceRequest {
	t.Helper()
	reqs, err := readTraceFile(miniTrace, 4)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// TestReadTrace reads the fixture plain and gzipped: the same requests,
// blank lines skipped but counted in line numbers.
func TestReadTrace(t *testing.T) {
	plain := readMini(t)
	if len(plain) != 5 {
		t.Fatalf("%d requests, want 5", len(plain))
	}
	want := traceRequest{Line: 6, Arrival: 400 * time.Millisecond, Input: 9, Output: 0, Blocks: []int64{1, 2, 3}}
	if got := plain[4]; got.Line != want.Line || got.Arrival != want.Arrival || got.Input != want.Input ||
		got.Output != want.Output || !slices.Equal(got.Blocks, want.Blocks) {
		t.Fatalf("last request %+v, want %+v", got, want)
	}
	if plain[3].Line != 5 {
		t.Fatalf("the request after the blank line is on line %d, want 5", plain[3].Line)
	}

	raw, err := os.ReadFile(miniTrace)
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw)
	zw.Close()
	path := t.TempDir() + "/mini.jsonl.gz"
	if err := os.WriteFile(path, gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	zipped, err := readTraceFile(path, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(plain, zipped, func(a, b traceRequest) bool {
		return a.Line == b.Line && a.Arrival == b.Arrival && a.Input == b.Input && a.Output == b.Output && slices.Equal(a.Blocks, b.Blocks)
	}) {
		t.Fatalf("gzipped %+v\nplain %+v", zipped, plain)
	}
}

// TestReadTraceOrder sorts by arrival, keeping the file's order for equal
// timestamps, and accepts fractional milliseconds.
func TestReadTraceOrder(t *testing.T) {
	in := `{"timestamp": 50, "input_length": 1, "output_length": 1, "hash_ids": [7]}
{"timestamp": 20.5, "input_length": 1, "output_length": 1, "hash_ids": [8]}
{"timestamp": 50, "input_length": 1, "output_length": 1, "hash_ids": [9]}
`
	reqs, err := readTrace(strings.NewReader(in), 4)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, r := range reqs {
		ids = append(ids, r.Blocks[0])
	}
	if !slices.Equal(ids, []int64{8, 7, 9}) || reqs[0].Arrival != 20500*time.Microsecond {
		t.Fatalf("order %v, first arrival %v", ids, reqs[0].Arrival)
	}
}

// TestReadTraceRefusesBadLines names the first bad line and what is wrong
// with it.
func TestReadTraceRefusesBadLines(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]}` + "\n"
	for _, c := range []struct {
		line, want string
	}{
		{`{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]`, "line 3: unexpected EOF"},
		{`not json`, "line 3: invalid character"},
		{`{"input_length": 5, "output_length": 1, "hash_ids": [1, 2]}`, "line 3: no timestamp"},
		{`{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]}`, "line 3: timestamp -1 is negative"},
		{`{"timestamp": 0, "output_length": 1, "hash_ids": [1, 2]}`, "line 3: no input_length"},
		{`{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`, "line 3: input_length 0 is below 1"},
		{`{"timestamp": 0, "input_length": 5, "hash_ids": [1, 2]}`, "line 3: no output_length"},
		{`{"timestamp": 0, "input_length": 5, "output_length": -2, "hash_ids": [1, 2]}`, "line 3: output_length -2 is negative"},
		{`{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}`, "line 3: input_length 5 makes 2 blocks of 4 tokens, but hash_ids has 1"},
		{`{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2, 3]}`, "but hash_ids has 3"},
		{`{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, -2]}`, "line 3: hash id -2 is negative"},
		{`{"timestamp": "0", "input_length": 5, "output_length": 1, "hash_ids": [1, 2]}`, "line 3: json: cannot unmarshal"},
		{`{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]} {}`, "line 3: more than one JSON value"},
	} {
		_, err := readTrace(strings.NewReader(good+"\n"+c.line+"\n"+good), 4)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.line, err, c.want)
		}
	}
	if _, err := readTrace(strings.NewReader(good), 0); err == nil {
		t.Error("block size 0 accepted")
	}
	if _, err := readTraceFile("testdata/no-such-trace.jsonl", 4); err == nil {
		t.Error("a missing file read")
	}
}

// TestTraceTokens checks the generator: a prompt as long as input_length,
// the last block cut, equal ids giving equal tokens wherever they are,
// distinct ids distinct tokens, every id below the vocabulary bound.
func TestTraceTokens(t *testing.T) {
	const bt = 8
	a := traceTokens(traceRequest{Input: 21, Blocks: []int64{10, 11, 12}}, bt)
	b := traceTokens(traceRequest{Input: 24, Blocks: []int64{10, 11, 99}}, bt)
	c := traceTokens(traceRequest{Input: 16, Blocks: []int64{12, 10}}, bt)
	if len(a) != 21 || len(b) != 24 || len(c) != 16 {
		t.Fatalf("lengths %d %d %d, want 21 24 16", len(a), len(b), len(c))
	}
	if !slices.Equal(a[:16], b[:16]) {
		t.Fatal("equal leading ids made different tokens")
	}
	if slices.Equal(a[16:], b[16:21]) {
		t.Fatal("ids 12 and 99 made the same tokens")
	}
	// Block 12 is a's cut last block (5 tokens) and c's first, whole one.
	if !slices.Equal(a[16:], c[:5]) || !slices.Equal(c[8:], a[:8]) {
		t.Fatal("an id does not give the same tokens at another position")
	}
	if slices.Equal(a[:8], a[8:16]) {
		t.Fatal("ids 10 and 11 made the same tokens")
	}
	seen := map[uint32]bool{}
	for _, tok := range append(a, b...) {
		if tok >= traceVocab {
			t.Fatalf("token %d is not below %d", tok, traceVocab)
		}
		seen[tok] = true
	}
	if len(seen) < 25 {
		t.Fatalf("only %d distinct tokens in 32 generated ones", len(seen))
	}
	if again := traceTokens(traceRequest{Input: 21, Blocks: []int64{10, 11, 12}}, bt); !slices.Equal(a, again) {
		t.Fatal("the generator is not deterministic")
	}
}

// TestServedTokens checks the counting rule: matched blocks, never the
// last token, whole engine blocks.
func TestServedTokens(t *testing.T) {
	for _, c := range []struct{ matched, input, bt, eb, want int }{
		{0, 10, 4, 2, 0},
		{2, 10, 4, 2, 8},
		{3, 10, 4, 2, 8},   // all of it: 9 tokens, 8 in whole engine blocks
		{3, 10, 4, 1, 9},   // all but the last token
		{2, 8, 4, 2, 6},    // all of it: 7 tokens
		{2, 8, 4, 0, 7},    // no engine block size: any count
		{1, 1, 512, 16, 0}, // a one-token prompt serves nothing
	} {
		if got := servedTokens(c.matched, c.input, c.bt, c.eb); got != c.want {
			t.Errorf("servedTokens(%d, %d, %d, %d) = %d, want %d", c.matched, c.input, c.bt, c.eb, got, c.want)
		}
	}
}

// TestTraceCeilings computes both ceilings of the fixture by hand (blocks
// of 4 tokens, engine blocks of 2, a capacity of 3 blocks).
func TestTraceCeilings(t *testing.T) {
	reqs := readMini(t)
	unbounded, capacity := traceCeilings(reqs, 4, 2, 3)
	// 1: nothing cached. 2: ids 1 2 (8 tokens). 3: ids 1 2, all of a
	// 8-token prompt, so 7 tokens, 6 in engine blocks. 4: id 5 is new,
	// and its 2 follows another block than line 1's 2. 5: line 1's
	// chain, all of a 9-token prompt: 8 tokens.
	if want := []int{0, 8, 6, 0, 8}; !slices.Equal(unbounded, want) {
		t.Errorf("unbounded %v, want %v", unbounded, want)
	}
	// With 3 blocks: after 1, {1, 12, 123}. 2 matches 1 and 12 and its
	// new 124 evicts 123 (its tail went first). 3 matches 1 and 12. 4's
	// two new blocks evict 124 and 12. 5 finds 1 only: 4 tokens.
	if want := []int{0, 8, 6, 0, 4}; !slices.Equal(capacity, want) {
		t.Errorf("capacity %v, want %v", capacity, want)
	}
	if _, c := traceCeilings(reqs, 4, 2, 0); c != nil {
		t.Errorf("capacity 0 computed %v", c)
	}
	// Large enough, the LRU cache is the unbounded one.
	if u, c := traceCeilings(reqs, 4, 2, 100); !slices.Equal(u, c) {
		t.Errorf("a 100-block LRU %v differs from unbounded %v", c, u)
	}
}

// TestCapacityCeilingEvictsTailsFirst: a prompt that fills the cache
// leaves its leading blocks, as vLLM's LRU does, so the same prompt again
// reuses its prefix.
func TestCapacityCeilingEvictsTailsFirst(t *testing.T) {
	r := traceRequest{Input: 12, Blocks: []int64{1, 2, 3}}
	_, c := traceCeilings([]traceRequest{r, r}, 4, 1, 2)
	if c[1] != 8 {
		t.Fatalf("the repeated prompt reused %d tokens from a 2-block cache, want 8 (its first two blocks)", c[1])
	}
}

func TestFleetBlocks(t *testing.T) {
	if got := fleetBlocksOf(0, 32768, 8, 16, 512); got != 8192 {
		t.Errorf("8 workers x 32,768 blocks of 16 = %d blocks of 512, want 8192", got)
	}
	if got := fleetBlocksOf(100, 32768, 8, 16, 512); got != 100 {
		t.Errorf("--fleet-blocks not preferred: %d", got)
	}
	if got := fleetBlocksOf(0, 0, 8, 16, 512); got != 0 {
		t.Errorf("no --kv-blocks gave %d", got)
	}
}
