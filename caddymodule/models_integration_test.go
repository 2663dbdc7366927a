package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// adapterWorkers starts the workers of model m with the given adapters
// (and one of model n), and a gateway that declares them by their
// endpoints and model only; it returns once every engine was read.
func adapterWorkers(t *testing.T, tester *testCaddy, adapters ...[]string) []*testWorker {
	t.Helper()
	var workers []*testWorker
	decl := ""
	for i, as := range adapters {
		w := newTestWorker(t, uint64(i+1))
		w.setEngine(func(e *testEngine) { e.adapters = as })
		workers = append(workers, w)
		decl += workerBlock(w)
	}
	n := newTestWorker(t, uint64(len(adapters)+1))
	n.setEngine(func(e *testEngine) { e.model, e.maxModelLen = "n", 2048 })
	decl += strings.Replace(workerBlock(n), "model_name m", "model_name n", 1)
	workers = append(workers, n)
	tester.InitServer(proxyCaddyfile(decl), "caddyfile")
	for _, w := range workers {
		w.waitSubscribed()
		waitRecord(t, w.id, "read", func(r *selection.WorkerRecord) bool { return r.EngineBlockSize != nil })
	}
	return workers
}

// TestModelsListsEveryCatalogModelOnce: GET /v1/models through the
// gateway is answered from the catalog in vLLM's shape: each base model
// once with its context length, each adapter once with its base model as
// parent and root, whichever workers serve them.
func TestModelsListsEveryCatalogModelOnce(t *testing.T) {
	tester := newTester(t)
	adapterWorkers(t, tester, []string{"sql", "chat"}, []string{"sql", "poem"})
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string          `json:"id"`
			Object      string          `json:"object"`
			Created     int64           `json:"created"`
			OwnedBy     string          `json:"owned_by"`
			Root        string          `json:"root"`
			Parent      *string         `json:"parent"`
			MaxModelLen *uint64         `json:"max_model_len"`
			Permission  json.RawMessage `json:"permission"`
		} `json:"data"`
	}
	callJSON(t, tester, http.MethodGet, "/v1/models", "", http.StatusOK, &list)
	var got []string
	for _, c := range list.Data {
		parent, maxLen := "null", "null"
		if c.Parent != nil {
			parent = *c.Parent
		}
		if c.MaxModelLen != nil {
			maxLen = fmt.Sprint(*c.MaxModelLen)
		}
		got = append(got, fmt.Sprintf("%s parent=%s root=%s max_model_len=%s", c.ID, parent, c.Root, maxLen))
		if c.Object != "model" || c.OwnedBy != "kvrouter" || c.Created == 0 || string(c.Permission) != "[]" {
			t.Errorf("card %+v", c)
		}
	}
	want := []string{
		"m parent=null root=m max_model_len=4096",
		"n parent=null root=n max_model_len=2048",
		"chat parent=m root=m max_model_len=null",
		"poem parent=m root=m max_model_len=null",
		"sql parent=m root=m max_model_len=null",
	}
	if list.Object != "list" || !slices.Equal(got, want) {
		t.Fatalf("GET /v1/models: %s\n%s\nwant\n%s", list.Object, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestAdapterRequestsLandOnlyOnWorkersServingThem: a request naming an
// adapter goes, with its model unchanged, only to a worker that serves
// the adapter (the others would answer 404), and its text is tokenized
// by such a worker only; the base model's requests go anywhere; a model
// nobody serves is the gateway's 404.
func TestAdapterRequestsLandOnlyOnWorkersServingThem(t *testing.T) {
	tester := newTester(t)
	ws := adapterWorkers(t, tester, []string{"sql"}, []string{"chat", "poem"}, []string{"poem"}, nil)
	tokenized := func() []int64 {
		var out []int64
		for _, w := range ws {
			out = append(out, w.tokenized.Load())
		}
		return out
	}
	tokens := func(i int) string { return `"prompt":` + tokensJSON(seqTokens(i*100, 40)) }
	text := func(i int) string { return fmt.Sprintf(`"prompt":"a poem about the number %d"`, i) }
	chat := func(i int) string {
		return fmt.Sprintf(`"messages":[{"role":"user","content":"tell me a story, number %d"}]`, i)
	}
	for _, tc := range []struct {
		model, path string
		body        func(i int) string
		workers     []string // the workers it may land on
		tokenizers  []uint64 // the workers whose /tokenize it asks
	}{
		{"sql", "/v1/completions", tokens, []string{"1"}, nil},
		{"chat", "/v1/chat/completions", chat, []string{"2"}, []uint64{2}},
		{"poem", "/v1/completions", text, []string{"2", "3"}, []uint64{2, 3}},
		{"m", "/v1/completions", tokens, []string{"1", "2", "3", "4"}, nil},
	} {
		before := tokenized()
		landed := map[string]int{}
		for i := range 40 {
			res, text := post(t, tester, tc.path, `{"model":"`+tc.model+`",`+tc.body(i)+`}`)
			if res.StatusCode != 200 {
				t.Fatalf("%s request %d: status %d: %s", tc.model, i, res.StatusCode, text)
			}
			landed[res.Header.Get("X-KVRouter-Worker")]++
		}
		for worker := range landed {
			if !slices.Contains(tc.workers, worker) {
				t.Errorf("%s requests landed on %v, want only on %v", tc.model, landed, tc.workers)
			}
		}
		if len(landed) != len(tc.workers) {
			t.Errorf("%s requests landed on %v, want on each of %v", tc.model, landed, tc.workers)
		}
		for i, n := range tokenized() {
			if asked := n - before[i]; asked > 0 != slices.Contains(tc.tokenizers, ws[i].id) {
				t.Errorf("%s requests asked worker %d's /tokenize %d times, want only workers %v asked", tc.model, ws[i].id, asked, tc.tokenizers)
			}
		}
	}
	if n := ws[0].servedModel("sql") + ws[1].servedModel("chat") + ws[1].servedModel("poem") + ws[2].servedModel("poem"); n != 120 {
		t.Errorf("the engines answered %d adapter requests under the adapter's name, want 120", n)
	}

	res, body := post(t, tester, "/v1/completions", `{"model":"nope","prompt":[1,2,3]}`)
	if e := openAIErrorOf(t, body); res.StatusCode != 404 || e.Code != 404 || e.Message != "The model `nope` does not exist." ||
		res.Header.Get("X-KVRouter-Worker") != "" {
		t.Fatalf("unknown model: %d %s", res.StatusCode, body)
	}
	waitNoReservations(t)
}
