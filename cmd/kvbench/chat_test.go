package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestChatShareSpreadsSessions(t *testing.T) {
	for _, c := range []struct {
		share float64
		want  int
	}{{0, 0}, {0.5, 5}, {0.25, 2}, {1, 10}} {
		n := 0
		for s := range 10 {
			if isChat(s, c.share) {
				n++
			}
		}
		if n != c.want {
			t.Errorf("share %v: %d of 10 sessions chat, want %d", c.share, n, c.want)
		}
	}
	tr, _ := buildTrace(workloadConfig{Kind: "multiturn", Sessions: 4, Turns: 2, TurnTokens: 8, OutputTokens: 2, ChatShare: 1, Seed: 1})
	for _, s := range tr {
		if s.Chat {
			t.Fatal("a multiturn session was made chat: --chat-share is for the agentic workload")
		}
	}
}

// TestChatMessagesExtendEachTurn checks a chat session's requests: the
// shared system prompt, the tools, each turn's messages a prefix of the
// next turn's (until a compaction), the assistant's actual answers and
// the tool calls with their results.
func TestChatMessagesExtendEachTurn(t *testing.T) {
	tr, err := buildTrace(workloadConfig{Kind: "agentic", Sessions: 2, Turns: 6, SystemTokens: 32, TaskTokens: 40, TurnTokens: 16,
		OutputTokens: 4, MaxISL: 1 << 20, ChatShare: 1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	s := tr[1]
	answers := []string{" first answer.", "", " third", " fourth", " fifth", ""}
	var prev []chatMessage
	tools := 0
	for k, turn := range s.Turns {
		if !slices.Equal(concat(turn.Messages), turn.Prompt) {
			t.Fatalf("turn %d: the messages are not the prompt", k)
		}
		body, err := chatBody("m", s.ID, turn, answers)
		if err != nil {
			t.Fatal(err)
		}
		var req struct {
			Model         string          `json:"model"`
			Stream        bool            `json:"stream"`
			StreamOptions map[string]bool `json:"stream_options"`
			Tools         []any           `json:"tools"`
			Messages      []chatMessage   `json:"messages"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			t.Fatalf("turn %d body: %v\n%s", k, err, body)
		}
		if req.Model != "m" || !req.Stream || !req.StreamOptions["include_usage"] || len(req.Tools) != 4 {
			t.Fatalf("turn %d request %+v", k, req)
		}
		msgs := req.Messages
		if msgs[0].Role != "system" || msgs[0].Content != wordsOf(tr[0].Turns[0].Messages[0].IDs) {
			t.Fatal("the system prompt is not the shared one")
		}
		if len(msgs) <= len(prev) || !equalMessages(msgs[:len(prev)], prev) {
			t.Fatalf("turn %d does not extend turn %d", k, k-1)
		}
		for i, m := range msgs {
			switch m.Role {
			case "assistant":
				if len(m.ToolCalls) > 0 {
					tools++
					if i+1 >= len(msgs) || msgs[i+1].Role != "tool" || msgs[i+1].ToolCallID != m.ToolCalls[0].ID {
						t.Fatalf("turn %d: a tool call without its result", k)
					}
				}
			case "tool":
				if msgs[i-1].Role != "assistant" {
					t.Fatalf("turn %d: a tool result after %s", k, msgs[i-1].Role)
				}
			}
		}
		prev = msgs
	}
	if tools == 0 {
		t.Fatal("no tool calls in six agentic turns")
	}
	// The answers the model gave are sent back; a failed turn's trace
	// words stand in.
	if prev[2].Role != "assistant" || prev[2].Content != "first answer." {
		t.Fatalf("first answer sent as %+v", prev[2])
	}
	if c := prev[len(prev)-1]; c.Role != "user" {
		t.Fatalf("last message %+v", c)
	}
}

// equalMessages compares two message lists.
func equalMessages(a, b []chatMessage) bool {
	return slices.EqualFunc(a, b, func(x, y chatMessage) bool {
		return x.Role == y.Role && x.Content == y.Content && x.ToolCallID == y.ToolCallID && len(x.ToolCalls) == len(y.ToolCalls)
	})
}

// TestRunTraceSendsChat plays a half-chat trace against a server that
// answers chat with a text it then expects back, and checks usage is
// read for both kinds.
func TestRunTraceSendsChat(t *testing.T) {
	var mu sync.Mutex
	paths := map[string]int{}
	var missing []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		paths[r.URL.Path]++
		// Every chat turn after the first carries the earlier answer.
		if r.URL.Path == "/v1/chat/completions" && strings.Count(string(body), `"role":"assistant"`) > 0 && !strings.Contains(string(body), `"content":"answer text"`) {
			missing = append(missing, string(body[:min(len(body), 200)]))
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Kvmock-Cached-Tokens", "7")
		if r.URL.Path == "/v1/chat/completions" {
			fmt.Fprint(w, `data: {"choices":[{"delta":{"role":"assistant","content":" answer"}}]}`+"\n\n")
			fmt.Fprint(w, `data: {"choices":[{"delta":{"content":" text"}}]}`+"\n\n")
			// No cached tokens in usage: vLLM leaves them out when 0.
			fmt.Fprint(w, `data: {"choices":[],"usage":{"prompt_tokens":90}}`+"\n\n")
		} else {
			fmt.Fprint(w, `data: {"choices":[{"text":" a"}]}`+"\n\n")
			fmt.Fprint(w, `data: {"choices":[],"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":64}}}`+"\n\n")
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	trace, _ := buildTrace(workloadConfig{Kind: "agentic", Sessions: 4, Turns: 3, SystemTokens: 16, TaskTokens: 16, TurnTokens: 8,
		OutputTokens: 2, MaxISL: 1 << 20, ChatShare: 0.5, Seed: 2})
	rs := runTrace(context.Background(), srv.URL, "m", trace, 2, time.Minute)
	s := summarize("p", srv.URL, rs, time.Second, 0, trace, 4)
	if paths["/v1/chat/completions"] != 6 || paths["/v1/completions"] != 6 || s.ChatRequests != 6 || s.Errors != 0 {
		t.Fatalf("paths %v, summary %+v", paths, s)
	}
	if len(missing) > 0 {
		t.Fatalf("a chat turn did not send the earlier answer back: %q", missing[0])
	}
	// Chat usage had no cached tokens: the header's 7 stand in; the
	// completions' usage says 64.
	if s.PromptTokens != 6*90+6*100 || s.CachedTokens != 6*7+6*64 || s.CachedInUsage != 6 {
		t.Fatalf("prompt %d cached %d in usage %d", s.PromptTokens, s.CachedTokens, s.CachedInUsage)
	}
	for _, r := range rs {
		if trace[r.Session].Chat && r.Text != " answer text" {
			t.Fatalf("answer text %q", r.Text)
		}
	}
}

func TestPredictionsAreDiffedPerRun(t *testing.T) {
	var mu sync.Mutex
	counts := modelPredictions{}
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"workers": []any{}, "predictions": map[string]modelPredictions{"m": counts}})
	}))
	defer admin.Close()
	counts = modelPredictions{Requests: 50, CachedExact: 40, NoCachedTokens: 5}
	w := newPredictionWatch(admin.URL)
	w.start()
	mu.Lock()
	counts = modelPredictions{Requests: 150, CachedExact: 137, NoCachedTokens: 5, PromptTokensMismatch: 2, PredictedCachedTokens: 900, ReportedCachedTokens: 880}
	mu.Unlock()
	p := w.stop()
	if p == nil || p.Requests != 100 || p.CachedExact != 97 || p.Accuracy != 0.97 || p.PromptTokensMismatch != 2 || p.ReportedCachedTokens != 880 {
		t.Fatalf("report %+v", p)
	}
	// A gateway without the section: not available, and no failure.
	bare := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"workers":[]}`) }))
	defer bare.Close()
	w = newPredictionWatch(bare.URL)
	w.start()
	if p := w.stop(); p != nil || !strings.Contains(w.state, "no predictions section") {
		t.Fatalf("report %+v, state %q", p, w.state)
	}
	var nilWatch *predictionWatch
	nilWatch.start()
	if nilWatch.stop() != nil {
		t.Fatal("a nil watch reported")
	}
}

// TestChatSurvivesCompaction checks that compacted contexts still make
// well-formed requests whose messages are the compacted prompt.
func TestChatSurvivesCompaction(t *testing.T) {
	tr, _ := buildTrace(workloadConfig{Kind: "agentic", Sessions: 2, Turns: 12, SystemTokens: 64, TaskTokens: 40, TurnTokens: 16,
		OutputTokens: 4, MaxISL: 100, ChatShare: 1, Seed: 1})
	for _, s := range tr {
		for k, turn := range s.Turns {
			if len(turn.Prompt) > 100 || !slices.Equal(concat(turn.Messages), turn.Prompt) || turn.Messages[0].Role != "system" {
				t.Fatalf("session %d turn %d: %d tokens, messages %d", s.ID, k, len(turn.Prompt), len(turn.Messages))
			}
			body, err := chatBody("m", s.ID, turn, nil)
			if err != nil || !json.Valid(body) {
				t.Fatalf("session %d turn %d: %v", s.ID, k, err)
			}
		}
	}
}
