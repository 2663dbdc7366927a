package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/indexer"
)

// Helpers shared by the tests: a small, fast fleet on free ports, HTTP
// calls, and ZMQ clients that read what the fleet publishes.

// testConfig is a two-worker fleet on free ports with a small cache and
// quick steps, so that tests take milliseconds of simulated compute.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Workers = 2
	cfg.HTTPBasePort, cfg.ZMQBasePort, cfg.ReplayBasePort = 0, 0, 0
	cfg.Admin = "127.0.0.1:0"
	cfg.KVBlocks = 256
	cfg.PrefillRate = 10000
	cfg.DecodeTime = time.Millisecond
	cfg.MaxTokens = 2
	cfg.ReplayBuffer = 100
	// The tests read the cached tokens from usage.
	cfg.EnablePromptTokensDetails = true
	return cfg
}

func newTestFleet(t *testing.T, change func(*Config)) *Fleet {
	t.Helper()
	cfg := testConfig()
	if change != nil {
		change(&cfg)
	}
	f, err := NewFleet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// url is the base URL of worker id.
func (f *Fleet) url(id int) string { return "http://" + f.workers[id-1].addr }

// adminURL is the base URL of the admin API.
func (f *Fleet) adminURL() string { return "http://" + f.AdminAddr() }

// tokenRange returns n token ids starting at first.
func tokenRange(first, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(first + i)
	}
	return out
}

// completion is the part of a completion answer the tests read.
type completion struct {
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// postJSON posts body (marshalled unless it is a string) and returns the
// response with its body read.
func postJSON(t *testing.T, url string, body any) (*http.Response, []byte) {
	t.Helper()
	var raw []byte
	if s, ok := body.(string); ok {
		raw = []byte(s)
	} else {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	res, err := http.Post(url, "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, b
}

// complete runs a non-streamed completion of tokens and returns its
// answer and how long it took.
func complete(t *testing.T, f *Fleet, id int, tokens []uint32, maxTokens int) (completion, time.Duration) {
	t.Helper()
	start := time.Now()
	res, b := postJSON(t, f.url(id)+"/v1/completions", map[string]any{"prompt": tokens, "max_tokens": maxTokens})
	took := time.Since(start)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("completion: %d %s", res.StatusCode, b)
	}
	if got := res.Header.Get("X-Kvmock-Worker"); got != fmt.Sprint(id) {
		t.Fatalf("X-Kvmock-Worker = %q, want %d", got, id)
	}
	var c completion
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if c.Usage == nil {
		t.Fatalf("no usage: %s", b)
	}
	return c, took
}

// zmqClient is a test-side ZMQ context; its sockets are used only by the
// test goroutine.
type zmqClient struct {
	t     *testing.T
	zctx  *zmq.Context
	socks []*zmq.Socket
}

func newZMQClient(t *testing.T) *zmqClient {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	c := &zmqClient{t: t, zctx: zctx}
	t.Cleanup(func() {
		for _, s := range c.socks {
			s.Close()
		}
		_ = zctx.Term()
	})
	return c
}

func (c *zmqClient) socket(typ zmq.Type, endpoint string) *zmq.Socket {
	c.t.Helper()
	s, err := c.zctx.NewSocket(typ)
	if err != nil {
		c.t.Fatal(err)
	}
	c.socks = append(c.socks, s)
	_ = s.SetLinger(0)
	_ = s.SetRcvtimeo(3 * time.Second)
	if err := s.Connect(endpoint); err != nil {
		c.t.Fatal(err)
	}
	return s
}

// subscribe connects a SUB socket to rank r's publisher in fleet f and
// waits until the subscription has reached it (ZMQ's slow joiner: a PUB
// drops what it publishes before it knows of the subscriber). The fleet's
// sockets are XPUBs that hand over the subscriptions they receive, so the
// wait ends when r counts one, as GET /stats would show, and from then on
// nothing r publishes is lost to this subscriber. r must have no other
// subscriber (an XPUB passes a topic's first subscription only).
func (c *zmqClient) subscribe(f *Fleet, r *rankPub) *zmq.Socket {
	c.t.Helper()
	s := c.socket(zmq.SUB, r.PubEndpoint)
	if err := s.SetSubscribe(""); err != nil {
		c.t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.pub.refreshSubs()
		if r.subs.Load() > 0 {
			return s
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("worker %d rank %d: the subscription never reached %s", r.worker, r.dpRank, r.PubEndpoint)
		}
		time.Sleep(time.Millisecond)
	}
}

// recv reads one published message: [topic, seq, payload].
func recv(t *testing.T, s *zmq.Socket) (uint64, []byte) {
	t.Helper()
	f, err := s.RecvMessageBytes(0)
	if err != nil {
		t.Fatalf("no KV-event message: %v", err)
	}
	if len(f) != 3 || len(f[0]) != 0 || len(f[1]) != 8 {
		t.Fatalf("message frames %q", f)
	}
	return binary.BigEndian.Uint64(f[1]), f[2]
}

// expectNothing checks that no message arrives within d.
func expectNothing(t *testing.T, s *zmq.Socket, d time.Duration) {
	t.Helper()
	_ = s.SetRcvtimeo(d)
	defer s.SetRcvtimeo(3 * time.Second)
	if f, err := s.RecvMessageBytes(0); err == nil {
		t.Fatalf("unexpected message %q", f)
	}
}

// decoded is a decoded batch with its events copied out of the decoder.
type decoded struct {
	dpRank int64
	events []indexer.Event
}

func decode(t *testing.T, payload []byte) decoded {
	t.Helper()
	var d indexer.Decoder
	b, err := d.Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	out := decoded{dpRank: b.DPRank}
	for _, ev := range b.Events {
		ev.BlockHashes = slices.Clone(ev.BlockHashes)
		ev.TokenIDs = slices.Clone(ev.TokenIDs)
		out.events = append(out.events, ev)
	}
	return out
}

// replay asks a replay endpoint for everything from start, as a DEALER
// does, and returns the batches up to the end marker.
func (c *zmqClient) replay(endpoint string, start uint64) (seqs []uint64, payloads [][]byte) {
	c.t.Helper()
	d := c.socket(zmq.DEALER, endpoint)
	var s8 [8]byte
	binary.BigEndian.PutUint64(s8[:], start)
	if _, err := d.SendMessage([]byte{}, s8[:]); err != nil {
		c.t.Fatal(err)
	}
	for {
		f, err := d.RecvMessageBytes(0)
		if err != nil {
			c.t.Fatalf("replay: %v", err)
		}
		if len(f) != 3 || len(f[0]) != 0 || len(f[1]) != 8 {
			c.t.Fatalf("replay frames %q", f)
		}
		if bytes.Equal(f[1], endMarker) {
			if len(f[2]) != 0 {
				c.t.Fatalf("end marker with payload %q", f[2])
			}
			return seqs, payloads
		}
		seqs = append(seqs, binary.BigEndian.Uint64(f[1]))
		payloads = append(payloads, f[2])
	}
}

// admin posts to the admin API and fails the test on a non-200 answer.
func admin(t *testing.T, f *Fleet, path string) []byte {
	t.Helper()
	res, b := postJSON(t, f.adminURL()+path, "")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, res.StatusCode, b)
	}
	return b
}

// get fetches a URL and returns its status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// words is a text prompt of n distinct words.
func words(prefix string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return strings.Join(w, " ")
}
