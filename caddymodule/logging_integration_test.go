package caddymodule

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInfoLogsCarryNoPrompt runs the gateway with its logs and an access
// log at INFO, written to files, and sends requests whose token ids and
// prompt text are found nowhere else: routed ones, tokenized text and
// chat, failovers, a 502, a stream cut by its worker, and refused bodies
// (400, 413, 415, 422) on the proxy path and the selection API. None of
// those values may appear in what was logged.
func TestInfoLogsCarryNoPrompt(t *testing.T) {
	tester := newTester(t)
	dir := t.TempDir()
	serverLog, accessLog := filepath.Join(dir, "caddy.log"), filepath.Join(dir, "access.log")
	live, dead, deadAlone := newTestWorker(t, 1), newTestWorker(t, 2), newTestWorker(t, 3)
	// Workers 2 and 3 publish events but their HTTP ports are closed:
	// worker 2 makes requests fail over to worker 1, and worker 3, the only
	// one of model d, makes them fail with a 502.
	_ = dead.srv.Close()
	_ = deadAlone.srv.Close()
	workers := workerBlock(live) + workerBlock(dead) + strings.Replace(workerBlock(deadAlone), "model_name m", "model_name d", 1)
	cfg := fmt.Sprintf(`{
%s	log {
		output file %s
		format json
		level INFO
	}
	kv_router {
		block_size 4
%s
	}
}

:%d {
	bind 127.0.0.1
	log {
		output file %s
		format json
		level INFO
	}
	handle_path /api/* {
		kv_selection {
			max_body_size 4096
		}
	}
	handle {
		kv_router {
			max_body_size 4096
			tokenize_timeout 2s
		}
		reverse_proxy {
			dynamic kv_router
			lb_policy kv_router
			lb_retries 2
		}
	}
}
`, testGlobals, serverLog, workers, testHTTPPort, accessLog)
	tester.InitServer(cfg, "caddyfile")
	t.Cleanup(func() { forceReload(t, blankCaddyfile) }) // before the workers close
	live.waitSubscribed()
	dead.waitSubscribed()
	deadAlone.waitSubscribed()

	// The secrets: token ids and words that occur nowhere but in prompts.
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = 3141592601 + uint32(i)*7
	}
	const invalid = "9871234560123" // an out-of-range token id, echoed by the 422's text
	words := []string{"Zanzibarquokka", "marmaladeXylophone", "Quetzalcoatlpenumbra"}
	text := strings.Join(words, " ") + " is the prompt, "
	secrets := []string{invalid}
	secrets = append(secrets, words...)
	for _, tok := range tokens {
		secrets = append(secrets, fmt.Sprint(tok))
	}

	// Worker 2 holds the first half, so that prompt tries it first and
	// fails over; worker 1 holds the text, so the tokenized prompt is
	// routed by its tokens.
	dead.announce(tokens[:32], 4)
	deadAlone.announce(tokens[:32], 4)
	live.announce(textTokens(text), 4)
	waitIndexed(t, 2, 8)
	waitIndexed(t, 1, len(text)/4)
	before := testCounter(failoversTotal)

	toks := tokensJSON(tokens)
	big := `{"model":"m","prompt":` + tokensJSON(append(append(append([]uint32(nil), tokens...), tokens...), tokens...)) + `,"x":"` + strings.Repeat(text, 60) + `"}`
	cases := []struct {
		path, contentType, body string
		want                    int
	}{
		// The proxy path.
		{"/v1/completions", "application/json", `{"model":"m","prompt":` + toks + `}`, 200},                                      // fails over from worker 2
		{"/v1/completions", "application/json", `{"model":"m","prompt":"ignored","token_ids":` + toks + `}`, 200},                // token_ids
		{"/v1/completions", "application/json", `{"model":"m","prompt":"` + text + `"}`, 200},                                    // tokenized
		{"/v1/chat/completions", "application/json", `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`, 200}, // tokenized chat
		{"/v1/chat/completions", "application/json", `{"model":"m","messages":"` + text + `"}`, 200},                             // /tokenize refuses it: routed by load
		{"/v1/completions", "application/json", `{"model":"d","prompt":` + toks + `}`, 502},                                      // no live worker
		{"/v1/completions", "application/json", `{"model":"m","prompt":` + toks[:len(toks)/2], 400},                              // cut short
		{"/v1/completions", "application/json", `{"model":"m","prompt":"` + text, 400},                                           // unterminated text
		{"/v1/completions", "application/json", `{"model":"m","token_ids":` + toks[:len(toks)-1] + `,` + invalid + `]}`, 422},    // out of range
		{"/v1/completions", "application/json", `{"model":"m","token_ids":"` + text + `"}`, 422},                                 // wrong type
		{"/v1/completions", "application/json", big, 413},
		// The selection API.
		{"/api/select", "application/json", `{"model_name":"m","token_ids":` + toks + `}`, 200},
		{"/api/select", "application/json", `{"model_name":"m","token_ids":` + toks[:len(toks)/2], 400},
		{"/api/select", "application/json", `{"model_name":"m","token_ids":` + toks[:len(toks)-1] + `,` + invalid + `]}`, 422},
		{"/api/select", "application/json", `{"model_name":"m","token_ids":"` + text + `"}`, 422},
		{"/api/select", "application/json", strings.Replace(big, `"model"`, `"model_name"`, 1), 413},
		{"/api/select", "", `{"model_name":"m","token_ids":` + toks + `}`, 415},
	}
	for _, c := range cases {
		code, body := call(t, tester, http.MethodPost, c.path, c.contentType, c.body)
		if code != c.want {
			t.Errorf("POST %s %.60s…: status %d, want %d: %s", c.path, c.body, code, c.want, body)
		}
	}
	// A stream its worker cuts: reverse_proxy logs the aborted response.
	live.breakMid.Store(true)
	if res, text := post(t, tester, "/v1/completions", `{"model":"m","stream":true,"prompt":`+toks+`}`); strings.Contains(text, "[DONE]") {
		t.Errorf("the cut stream ended normally: %d %q", res.StatusCode, text)
	}
	live.breakMid.Store(false)
	if got := testCounter(failoversTotal) - before; got < 1 {
		t.Errorf("%v failovers, want at least 1", got)
	}
	// The tokenizer takes the model's workers in turn, dead ones too; one
	// text prompt at least reached the live worker's /tokenize.
	if live.tokenized.Load() < 1 {
		t.Error("no prompt text reached /tokenize")
	}
	waitNoReservations(t)

	// Unload the config so that every log line is written, then read both.
	forceReload(t, blankCaddyfile)
	logs := ""
	for _, f := range []string{serverLog, accessLog} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		logs += string(b)
	}
	// What must be there, or the test proves nothing.
	handled := strings.Count(logs, `"msg":"handled request"`)
	for _, want := range []string{`"msg":"handled request"`, `"status":502`, `"status":422`, `"status":413`, `"level":"error"`, "connection refused"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the logs lack %s", want)
		}
	}
	if handled < len(cases)+1 {
		t.Errorf("%d requests in the access log, want %d", handled, len(cases)+1)
	}
	if strings.Contains(logs, `"level":"debug"`) {
		t.Error("debug lines logged at INFO")
	}
	leaked := 0
	for _, s := range secrets {
		if i := strings.Index(logs, s); i >= 0 {
			leaked++
			if leaked <= 5 {
				line := logs[strings.LastIndexByte(logs[:i], '\n')+1:]
				line, _, _ = strings.Cut(line, "\n")
				t.Errorf("%q is in the logs: %s", s, line)
			}
		}
	}
	t.Logf("%d requests (%d in the access log), %d log lines, %d bytes; %d of %d token ids and prompt words found in them",
		len(cases)+1, handled, strings.Count(logs, "\n"), len(logs), leaked, len(secrets))
}
