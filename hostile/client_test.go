package hostile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HTTP as the attacker and the operator see it: statuses, bodies, and the
// admin routes' counters.

var (
	// quick is for probes and admin reads, which answer at once.
	quick = &http.Client{Timeout: 5 * time.Second}
	// slow is for attack requests, whose answers may be large or late.
	slow = &http.Client{Timeout: 60 * time.Second}
)

// answer is what one request got back. body holds at most the first MiB:
// an answer of 52 MB (issue 10's dp_size 1000000) must not bloat the test.
type answer struct {
	status  int
	header  http.Header
	body    []byte
	size    int64 // the whole body's length as read
	elapsed time.Duration
	err     error
}

const keepBody = 1 << 20

func call(c *http.Client, method, url string, body []byte, hdr map[string]string) answer {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return answer{err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err, elapsed: time.Since(start)}
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, header: resp.Header}
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(resp.Body, keepBody))
	rest, err2 := io.Copy(io.Discard, resp.Body)
	a.body, a.size, a.elapsed = buf.Bytes(), n+rest, time.Since(start)
	if err == nil {
		err = err2
	}
	a.err = err
	return a
}

// code is the answer's status, or the transport error's text.
func (a answer) code() string {
	if a.status == 0 {
		return "no answer (" + shortErr(a.err) + ")"
	}
	return strconv.Itoa(a.status)
}

func shortErr(err error) string {
	if err == nil {
		return "nil"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	return s
}

// reason is an error answer's message: the selection API's {"error": "…"},
// OpenAI's {"error": {"message": "…"}}, or the text itself, shortened.
func (a answer) reason() string {
	var api struct {
		Error json.RawMessage `json:"error"`
	}
	msg := strings.TrimSpace(string(a.body))
	if json.Unmarshal(a.body, &api) == nil && len(api.Error) > 0 {
		var s string
		var o struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(api.Error, &s) == nil {
			msg = s
		} else if json.Unmarshal(api.Error, &o) == nil {
			msg = o.Message
		}
	}
	return clip(msg, 90)
}

func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// openAIShape reports whether body is OpenAI's error object
// {"error":{"message":…,"type":…,"code":…}}, the shape the issue asks of
// every error the gateway answers on the OpenAI routes.
func openAIShape(body []byte) bool {
	var v struct {
		Error *struct {
			Message *string          `json:"message"`
			Type    *string          `json:"type"`
			Code    *json.RawMessage `json:"code"`
		} `json:"error"`
	}
	return json.Unmarshal(body, &v) == nil && v.Error != nil && v.Error.Message != nil &&
		v.Error.Type != nil && v.Error.Code != nil
}

// bearer is the Authorization header for a catalog write with token
// (none when token is empty).
func bearer(token string) map[string]string {
	if token == "" {
		return nil
	}
	return map[string]string{"Authorization": "Bearer " + token}
}

// write sends a catalog write to the selection API with the given token.
func (g *gateway) write(method, path string, body any, token string) answer {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return answer{err: err}
		}
	}
	return call(slow, method, g.api+path, b, bearer(token))
}

// register upserts a worker as its operator would, with the write token.
func (g *gateway) register(rec map[string]any) error {
	a := g.write(http.MethodPost, "/workers", rec, g.token)
	if a.status/100 != 2 {
		return fmt.Errorf("registering worker %v: %s %s", rec["worker_id"], a.code(), a.reason())
	}
	return nil
}

// workerRecord is a complete, schedulable registration: endpoint, model,
// block size and a KV-event endpoint.
func workerRecord(id uint64, endpoint, kvEvents string) map[string]any {
	return map[string]any{"worker_id": id, "model_name": model, "endpoint": endpoint,
		"block_size": blockSize, "kv_events_endpoint": kvEvents}
}

// stats flattens GET /kv_router/stats into "section.counter" → value.
func (g *gateway) stats() (map[string]float64, error) {
	resp, err := quick.Get(g.admin + "/kv_router/stats")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var raw map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		return nil, fmt.Errorf("/kv_router/stats: %v", err)
	}
	out := map[string]float64{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case float64:
			out[prefix] = x
		case bool:
			if x {
				out[prefix] = 1
			} else {
				out[prefix] = 0
			}
		case map[string]any:
			for k, e := range x {
				if prefix != "" {
					k = prefix + "." + k
				}
				walk(k, e)
			}
		}
	}
	walk("", raw)
	return out, nil
}

// statsDelta lists the counters that changed between two stats reads, as
// "name +n", for the observed column.
func statsDelta(before, after map[string]float64, only func(string) bool) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		if only != nil && !only(k) {
			continue
		}
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// metric sums the samples of one metric family on the admin /metrics.
func (g *gateway) metric(name string) (float64, error) {
	resp, err := quick.Get(g.admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // a longer name with this prefix
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
			found = true
		}
	}
	if !found {
		return 0, fmt.Errorf("no %s on /metrics", name)
	}
	return sum, nil
}

// indexedBlocks is what GET /kv_router/workers reports indexed under
// worker id, over all its ranks (-1 when the worker is not listed).
func (g *gateway) indexedBlocks(id uint64) (int, error) {
	resp, err := quick.Get(g.admin + "/kv_router/workers")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var ws []struct {
		WorkerID uint64 `json:"worker_id"`
		Ranks    []struct {
			IndexedBlocks int `json:"indexed_blocks"`
		} `json:"ranks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ws); err != nil {
		return 0, err
	}
	for _, w := range ws {
		if w.WorkerID == id {
			n := 0
			for _, r := range w.Ranks {
				n += r.IndexedBlocks
			}
			return n, nil
		}
	}
	return -1, nil
}

// completion sends an OpenAI completion with an integer-array prompt (the
// gateway routes it by its tokens, without a /tokenize round trip).
func (g *gateway) completion(c *http.Client, mdl string, prompt []uint32) answer {
	b, _ := json.Marshal(map[string]any{"model": mdl, "prompt": prompt, "max_tokens": 4})
	return call(c, http.MethodPost, g.proxy+"/v1/completions", b, nil)
}

// waitFor polls cond every 50 ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tokens returns n token ids starting at first, a prompt no other attack
// shares.
func tokens(first uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}

// goMemory is the gateway's Go heap in use and all the memory the Go
// runtime holds (go_memstats_sys_bytes), from Caddy's /metrics: RSS above
// the latter is memory outside Go (libzmq's queues, the C allocator) or
// the binary's own pages, which tells a leak in Go from one in C.
func (g *gateway) goMemory() string {
	inuse, err1 := g.metric("go_memstats_heap_inuse_bytes")
	sys, err2 := g.metric("go_memstats_sys_bytes")
	if err1 != nil || err2 != nil {
		return "Go memory unknown"
	}
	return fmt.Sprintf("Go heap in use %s, Go runtime total %s", mb(int64(inuse)), mb(int64(sys)))
}
