package fidelity

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/internal/proctest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	proctest.RemoveBuilds()
	os.Exit(code)
}

// client is for everything but the completions, which may take longer.
var client = &http.Client{Timeout: 30 * time.Second}

// blockSize is the gateway's and the engines' KV block size.
const blockSize = 16

// gateway is one bin/caddy with a proxy site and a selection API site.
type gateway struct {
	*proctest.Process
	admin, proxy, api string
	token             string
}

// startGateway starts bin/caddy on fresh loopback ports and waits until
// it answers.
func startGateway(t *testing.T) *gateway {
	t.Helper()
	return startGatewayWith(t, "")
}

// startGatewayWith is startGateway with more kv_router options (lines of
// the global option's block).
func startGatewayWith(t *testing.T, options string) *gateway {
	t.Helper()
	g := &gateway{token: randomToken()}
	p, _, err := proctest.StartCaddy(t, 3, func(pp []int) string {
		g.admin = fmt.Sprintf("http://127.0.0.1:%d", pp[0])
		g.proxy = fmt.Sprintf("http://127.0.0.1:%d", pp[1])
		g.api = fmt.Sprintf("http://127.0.0.1:%d", pp[2])
		return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	persist_config off
	auto_https off
	grace_period 1s
	kv_router {
		block_size %d
		%s
	}
}

:%d {
	bind 127.0.0.1
	kv_router
	reverse_proxy {
		dynamic kv_router
		lb_policy kv_router
	}
}

:%d {
	bind 127.0.0.1
	kv_selection {
		write_token {env.KVROUTER_WRITE_TOKEN}
	}
}
`, pp[0], blockSize, options, pp[1], pp[2])
	}, []string{"KVROUTER_WRITE_TOKEN=" + g.token}, func([]int) bool {
		return status(g.api+"/health") == http.StatusOK && status(g.admin+"/kv_router/stats") == http.StatusOK
	})
	if err != nil {
		t.Fatal(err)
	}
	g.Process = p
	return g
}

// status is the status of GET url, or 0 when it cannot be had.
func status(url string) int {
	res, err := client.Get(url)
	if err != nil {
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// fleet is one bin/kvmock.
type fleet struct {
	*proctest.Process
	admin string
}

// startFleet starts bin/kvmock with n workers on ports the OS chooses,
// registered with g (unless register is false), with extra flags, and
// waits until g can schedule them all.
func startFleet(t *testing.T, g *gateway, n int, register bool, flags ...string) *fleet {
	t.Helper()
	bin, err := proctest.Binary("kvmock")
	if err != nil {
		t.Fatal(err)
	}
	// The admin port was free a moment ago; another process can take it
	// before kvmock binds it, so a start that loses that race is tried
	// again on a new port.
	var f *fleet
	for attempt := 1; ; attempt++ {
		pp, err := proctest.FreePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		f = &fleet{admin: fmt.Sprintf("http://127.0.0.1:%d", pp[0])}
		args := []string{"--workers", fmt.Sprint(n), "--http-base-port", "0", "--zmq-base-port", "0", "--replay-base-port", "0",
			"--admin", fmt.Sprintf("127.0.0.1:%d", pp[0]), "--block-size", fmt.Sprint(blockSize), "--kv-blocks", "2048",
			"--prefill-rate", "2000000", "--decode-ms", "1", "--enable-prompt-tokens-details"}
		if register {
			args = append(args, "--register", g.api, "--register-token", g.token)
		}
		args = append(args, flags...)
		if f.Process, err = proctest.Start(t, t.TempDir(), bin, args, nil); err != nil {
			t.Fatal(err)
		}
		if f.waitHealthy() {
			break
		}
		if tail := f.LogTail(30); attempt < 3 && strings.Contains(tail, "address already in use") {
			f.Stop()
			continue
		}
		t.Fatalf("kvmock did not start (%s):\n%s", f.ExitReason(), f.LogTail(30))
	}
	if register {
		g.waitSchedulable(t, n)
	}
	return f
}

// waitHealthy waits up to 30 s for the fleet's admin API to answer
// /health; false when kvmock exited or the time ran out.
func (f *fleet) waitHealthy() bool {
	for deadline := time.Now().Add(30 * time.Second); status(f.admin+"/health") != http.StatusOK; {
		if !f.Alive() || time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// waitSchedulable waits until the gateway can schedule n workers.
func (g *gateway) waitSchedulable(t *testing.T, n int) {
	t.Helper()
	want := fmt.Sprintf(`"schedulable_workers":%d`, n)
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		res, err := client.Get(g.api + "/ready")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if last = string(b); strings.Contains(last, want) {
			return
		}
	}
	t.Fatalf("the gateway did not schedule %d workers: %s\n%s", n, last, g.LogTail(20))
}

// answer is one completion through the gateway.
type answer struct {
	status   int
	header   http.Header
	body     []byte
	usage    usage
	reported bool // the answer carried usage
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// cached is the engine's reported cache hit. The fleet runs with
// --enable-prompt-tokens-details, and like vLLM it then leaves the
// details out when nothing was cached.
func (u usage) cached() int {
	if u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

// post sends a completion body to path through the gateway and reads the
// usage from its JSON answer or from any SSE chunk that has one.
func (g *gateway) post(t *testing.T, path string, body any, header ...string) answer {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, g.proxy+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer res.Body.Close()
	a := answer{status: res.StatusCode, header: res.Header}
	if a.body, err = io.ReadAll(res.Body); err != nil {
		t.Fatalf("POST %s: reading the answer: %v", path, err)
	}
	for _, doc := range documents(a.body) {
		var v struct {
			Usage *usage
			// SGLang's /generate reports in meta_info instead.
			MetaInfo *struct {
				PromptTokens int `json:"prompt_tokens"`
				CachedTokens int `json:"cached_tokens"`
			} `json:"meta_info"`
		}
		if json.Unmarshal(doc, &v) != nil {
			continue
		}
		if v.Usage != nil {
			a.usage, a.reported = *v.Usage, true
		} else if m := v.MetaInfo; m != nil {
			a.usage.PromptTokens, a.reported = m.PromptTokens, true
			a.usage.PromptTokensDetails = &struct {
				CachedTokens int `json:"cached_tokens"`
			}{m.CachedTokens}
		}
	}
	return a
}

// documents are the JSON documents of an answer: the body itself, or the
// data of each SSE event.
func documents(body []byte) [][]byte {
	if !bytes.HasPrefix(body, []byte("data:")) {
		return [][]byte{body}
	}
	var out [][]byte
	for _, ev := range bytes.Split(body, []byte("\n\n")) {
		if d, ok := bytes.CutPrefix(bytes.TrimSpace(ev), []byte("data:")); ok && !bytes.Equal(bytes.TrimSpace(d), []byte("[DONE]")) {
			out = append(out, bytes.TrimSpace(d))
		}
	}
	return out
}

// predictions reads /kv_router/stats' predictions for model.
func (g *gateway) predictions(t *testing.T, model string) modelPredictions {
	t.Helper()
	res, err := client.Get(g.admin + "/kv_router/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var stats struct {
		Predictions map[string]modelPredictions `json:"predictions"`
	}
	if err := json.NewDecoder(res.Body).Decode(&stats); err != nil {
		t.Fatal(err)
	}
	return stats.Predictions[model]
}

// modelPredictions mirrors the gateway's "predictions" section.
type modelPredictions struct {
	Requests              uint64  `json:"requests"`
	NoUsage               uint64  `json:"no_usage"`
	NoCachedTokens        uint64  `json:"no_cached_tokens"`
	ReportsCached         bool    `json:"reports_cached_tokens"`
	PromptTokensMismatch  uint64  `json:"prompt_tokens_mismatch"`
	CachedExact           uint64  `json:"cached_exact"`
	PredictedCachedTokens uint64  `json:"predicted_cached_tokens"`
	ReportedCachedTokens  uint64  `json:"reported_cached_tokens"`
	Accuracy              float64 `json:"accuracy"`
}

// metrics returns the gateway's Prometheus text.
func (g *gateway) metrics(t *testing.T) string {
	t.Helper()
	res, err := client.Get(g.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// settle waits until the gateway's index holds as many blocks as the
// fleet's caches: the KV events of the answers so far have arrived. A
// request sent sooner is predicted from an index that lags the engines by
// the events in flight, as it would be in production; tests that compare
// predictions one request after another wait for it.
func (g *gateway) settle(t *testing.T, f *fleet) {
	t.Helper()
	var indexed, cached int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		indexed, cached = g.indexedBlocks(t), f.cachedBlocks(t)
		if indexed == cached {
			return
		}
	}
	t.Fatalf("the gateway's index holds %d blocks, the fleet's caches %d", indexed, cached)
}

// indexedBlocks sums the blocks the gateway's index holds for every rank.
func (g *gateway) indexedBlocks(t *testing.T) int {
	t.Helper()
	var workers []struct {
		Ranks []struct {
			IndexedBlocks int `json:"indexed_blocks"`
		} `json:"ranks"`
	}
	getJSON(t, g.admin+"/kv_router/workers", &workers)
	n := 0
	for _, w := range workers {
		for _, r := range w.Ranks {
			n += r.IndexedBlocks
		}
	}
	return n
}

// cachedBlocks is the fleet's total of cached blocks.
func (f *fleet) cachedBlocks(t *testing.T) int {
	t.Helper()
	var stats struct {
		Totals struct {
			CachedBlocks int `json:"cached_blocks"`
		} `json:"totals"`
	}
	getJSON(t, f.admin+"/stats", &stats)
	return stats.Totals.CachedBlocks
}

// register writes a worker to g's catalog through the selection API.
func (g *gateway) register(t *testing.T, worker map[string]any) {
	t.Helper()
	body, _ := json.Marshal(worker)
	req, _ := http.NewRequest(http.MethodPost, g.api+"/workers", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+g.token)
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		t.Fatalf("POST /workers %s: %d", body, res.StatusCode)
	}
}

// getJSON decodes the answer to GET url into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	res, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, res.StatusCode)
	}
	if err := json.NewDecoder(res.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
