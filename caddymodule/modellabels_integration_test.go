package caddymodule

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestModelLabelsFollowTheCatalog: models registered, used and deleted
// one after another leave no series behind once a scrape has seen them
// go, and between scrapes at most maxModelLabels of them are labelled
// apart. A thousand such models left 128,000 series, a 10 MB scrape.
func TestModelLabelsFollowTheCatalog(t *testing.T) {
	tester := newTester(t)
	w1 := newTestWorker(t, 1)
	tester.InitServer(proxyCaddyfile(workerBlock(w1)), "caddyfile")
	w1.waitSubscribed()
	cat := pooledState(t).router.Catalog()
	setModel := func(m string) {
		w1.engine.mu.Lock()
		w1.engine.model = m
		w1.engine.mu.Unlock()
	}
	const models = maxModelLabels + 44
	for i := range models {
		id, model := uint64(100+i), fmt.Sprint("churn-", i)
		if _, err := cat.UpsertWorker(&selection.WorkerRequest{WorkerID: &id, ModelName: &model, Endpoint: &w1.addr, BlockSize: ptr(uint32(4)), KVEventsEndpoint: &w1.pubEP}); err != nil {
			t.Fatal(err)
		}
		setModel(model)
		if res, body := post(t, tester, "/v1/completions", `{"model":"`+model+`","prompt":[1,2,3,4,5,6,7,8]}`); res.StatusCode != 200 {
			t.Fatalf("%s: %d %s", model, res.StatusCode, body)
		}
		if _, err := cat.DeleteWorker(id); err != nil {
			t.Fatal(err)
		}
	}
	waitNoReservations(t)
	// Before any scrape: the labels are bounded. "" is no model's: the
	// requests for a model no worker serves, always counted under it and
	// outside the bound; an earlier test's may still be there (the
	// metrics are the package's), beside a model of its own it labelled.
	labelled := modelsLabelled(requestsTotal)
	delete(labelled, "")
	if n := len(labelled); n > maxModelLabels+1 {
		t.Fatalf("%d models labelled apart in kvrouter_requests_total, want at most %d and %q", n, maxModelLabels, otherModels)
	}
	if !labelled[otherModels] {
		t.Fatalf("the models past %d are not counted under %q", maxModelLabels, otherModels)
	}
	scrape := func() string {
		res, err := tester.Client.Get(fmt.Sprintf("http://localhost:%d/metrics", testAdminPort))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return string(b)
	}
	scrape() // prunes
	// The cap was full: a request of m now is labelled apart again.
	setModel("m")
	if res, body := post(t, tester, "/v1/completions", `{"model":"m","prompt":[1,2,3,4,5,6,7,8]}`); res.StatusCode != 200 {
		t.Fatalf("m: %d %s", res.StatusCode, body)
	}
	waitNoReservations(t)
	text := scrape()
	if n := strings.Count(text, `model="churn-`) + strings.Count(text, `model="`+otherModels+`"`); n != 0 {
		t.Errorf("%d series of deleted models after two scrapes", n)
		shown := 0
		for _, l := range strings.Split(text, "\n") {
			if (strings.Contains(l, "churn-") || strings.Contains(l, "other models") || strings.Contains(l, `model="m"`)) && shown < 8 {
				t.Log(l)
				shown++
			}
		}
	}
	for _, want := range []string{`kvrouter_requests_total{mode="kv",model="m",outcome="routed"} `, `kvrouter_ttft_seconds_count{model="m"} `} {
		if !strings.Contains(text, want) {
			t.Errorf("the served model's series lack %s", want)
		}
	}
	if got := predictions.snapshot(); len(got) != 1 {
		t.Errorf("prediction counts kept for %d models, want 1 (m)", len(got))
	}
}

// modelsLabelled is the set of model label values v holds series of.
func modelsLabelled(v prometheus.Collector) map[string]bool {
	ch := make(chan prometheus.Metric, 1024)
	go func() { v.Collect(ch); close(ch) }()
	seen := map[string]bool{}
	for m := range ch {
		for _, l := range metricLabels(m) {
			if l.GetName() == "model" {
				seen[l.GetValue()] = true
			}
		}
	}
	return seen
}

// metricLabels are m's labels.
func metricLabels(m prometheus.Metric) []*dto.LabelPair {
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		panic(err)
	}
	return out.Label
}
