package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// result is what one request measured.
type result struct {
	Session, Turn int
	TTFT, E2E     time.Duration
	PromptTokens  int
	CachedTokens  int
	// CachedReported is set when usage carried
	// prompt_tokens_details.cached_tokens; otherwise CachedTokens comes
	// from kvmock's X-Kvmock-Cached-Tokens header, if any (see request).
	CachedReported bool
	Worker         string
	// Text is the answer's text, which a chat session's next turn sends
	// back as the assistant's message.
	Text string
	Err  error
}

// runTrace plays the sessions through url with conc concurrent sessions,
// each session's turns in order, until all are done or duration passes.
func runTrace(ctx context.Context, url, model string, sessions []session, conc int, duration time.Duration) []result {
	client := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: conc * 2,
		DialContext: pacedDialer(maxDialing)}}
	ctx, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	queue := make(chan *session)
	go func() {
		defer close(queue)
		for i := range sessions {
			select {
			case queue <- &sessions[i]:
			case <-ctx.Done():
				return
			}
		}
	}()
	var mu sync.Mutex
	var out []result
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range queue {
				answers := make([]string, len(s.Turns))
				for t := range s.Turns {
					if ctx.Err() != nil {
						return
					}
					r := request(ctx, client, targetFor(url, s.ID, t), model, s, t, answers)
					r.Session, r.Turn = s.ID, t
					answers[t] = r.Text
					if ctx.Err() != nil && r.Err != nil {
						return // cut by the deadline: not a failure of the gateway
					}
					mu.Lock()
					out = append(out, r)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// maxDialing bounds the connections a run dials at once. Thousands of
// sessions starting together would otherwise send their SYNs in one burst,
// overflow the gateway's accept queue (net.core.somaxconn, 4,096 here) and
// wait out TCP's retransmission back-off (1 s, 3 s, 7 s, …): at 8,192
// sessions that made most first requests seconds late, a cost of the
// load generator, not of the gateway.
const maxDialing = 256

// pacedDialer dials like net.Dialer, with at most n dials in flight.
func pacedDialer(n int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	slots := make(chan struct{}, n)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		defer func() { <-slots }()
		return d.DialContext(ctx, network, addr)
	}
}

// completionBody is the body of a streamed completion of a turn's token ids.
func completionBody(model string, tr turn) []byte {
	var body bytes.Buffer
	body.WriteString(`{"model":`)
	body.WriteString(strconv.Quote(model))
	body.WriteString(`,"stream":true,"stream_options":{"include_usage":true},"max_tokens":`)
	body.WriteString(strconv.Itoa(tr.Output))
	body.WriteString(`,"prompt":[`)
	for i, t := range tr.Prompt {
		if i > 0 {
			body.WriteByte(',')
		}
		body.WriteString(strconv.FormatUint(uint64(t), 10))
	}
	body.WriteString("]}")
	return body.Bytes()
}

// streamChunk is the part of a stream's chunk request reads: the text of
// a completion or chat chunk, and usage.
type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens  int `json:"prompt_tokens"`
		PromptDetails *struct {
			CachedTokens *int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// request sends turn t of session s as one streaming completion (or chat
// completion, for a chat session) and times its first token. answers are
// the texts of the session's earlier answers. Prompt and cached tokens are
// read from the usage chunk; when usage has no cached tokens (vLLM without
// --enable-prompt-tokens-details, or with it and none cached), kvmock's
// X-Kvmock-Cached-Tokens header stands in, so that a run against a fleet
// started without the flag still measures its hit ratio.
func request(ctx context.Context, client *http.Client, url, model string, s *session, t int, answers []string) result {
	tr := s.Turns[t]
	r := result{PromptTokens: len(tr.Prompt)}
	path, body := "/v1/completions", []byte(nil)
	if s.Chat {
		var err error
		if body, err = chatBody(model, s.ID, tr, answers); err != nil {
			r.Err = err
			return r
		}
		path = "/v1/chat/completions"
	} else {
		body = completionBody(model, tr)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(body))
	if err != nil {
		r.Err = err
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	res, err := client.Do(req)
	if err != nil {
		r.Err = err
		return r
	}
	defer res.Body.Close()
	if r.Worker = res.Header.Get("X-Kvmock-Worker"); r.Worker == "" {
		r.Worker = res.Header.Get("X-KVRouter-Worker")
	}
	if res.StatusCode != http.StatusOK {
		r.Err = fmt.Errorf("status %d", res.StatusCode)
		return r
	}
	if h := res.Header.Get("X-Kvmock-Cached-Tokens"); h != "" {
		r.CachedTokens, _ = strconv.Atoi(h)
	}
	var text strings.Builder
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue
		}
		data := bytes.TrimSpace(line[5:])
		if r.TTFT == 0 {
			r.TTFT = time.Since(start)
		}
		if bytes.Equal(data, []byte("[DONE]")) {
			break
		}
		var c streamChunk
		if json.Unmarshal(data, &c) != nil {
			continue
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Text)
			text.WriteString(ch.Delta.Content)
		}
		if u := c.Usage; u != nil {
			if u.PromptTokens > 0 {
				r.PromptTokens = u.PromptTokens
			}
			if u.PromptDetails != nil && u.PromptDetails.CachedTokens != nil {
				r.CachedTokens, r.CachedReported = *u.PromptDetails.CachedTokens, true
			}
		}
	}
	r.Text = text.String()
	r.E2E = time.Since(start)
	if err := sc.Err(); err != nil {
		r.Err = err
	} else if r.TTFT == 0 {
		r.Err = fmt.Errorf("no data in the stream")
	}
	return r
}

// postReset asks the fleet to drop its caches (kvmock's POST /reset).
func postReset(url string) error {
	res, err := http.Post(url, "application/json", strings.NewReader("{}"))
	if err != nil {
		return err
	}
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("reset: status %d", res.StatusCode)
	}
	return nil
}
