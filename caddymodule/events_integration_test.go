package caddymodule

import (
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/indexer"
)

// eventsCaddyfile runs the router in event mode (the default) with one
// declared worker whose KV events come from pubEP.
func eventsCaddyfile(pubEP string) string {
	return fmt.Sprintf(`{
%s	kv_router {
		block_size 4
		worker 1 {
			endpoint 127.0.0.1:9001
			model_name m
			kv_events %s
		}
		worker 2 {
			endpoint 127.0.0.1:9002
			model_name m
			kv_events tcp://127.0.0.1:1
		}
	}
}

:%d {
	bind 127.0.0.1
	kv_selection
}
`, testGlobals, pubEP, testHTTPPort)
}

// TestEventsSteerSelectionAcrossReload: a real ZMQ publisher's BlockStored
// events make /select pick its worker; a reload keeps the same listener
// (no new subscription, no gap, no restart) and the index.
func TestEventsSteerSelectionAcrossReload(t *testing.T) {
	tester := newTester(t)
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := zctx.NewSocket(zmq.XPUB)
	_ = pub.SetLinger(0)
	_ = pub.SetXpubVerbose(1)
	_ = pub.SetRcvtimeo(100 * time.Millisecond)
	t.Cleanup(func() { pub.Close(); _ = zctx.Term() })
	if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	pubEP, _ := pub.GetLastEndpoint()
	waitSub := func() bool {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if f, err := pub.RecvBytes(0); err == nil && len(f) > 0 && f[0] == 1 {
				return true
			}
		}
		return false
	}
	tester.InitServer(eventsCaddyfile(pubEP), "caddyfile")
	if !waitSub() {
		t.Fatal("the gateway never subscribed")
	}
	tokens := make([]uint32, 64)
	var tok []string
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
		tok = append(tok, fmt.Sprint(tokens[i]))
	}
	seq := uint64(0)
	publish := func(from, to int) {
		ev := &indexer.StoredBlocks{BlockSize: 4, TokenIDs: tokens[from*4 : to*4]}
		for b := from; b < to; b++ {
			ev.BlockHashes = append(ev.BlockHashes, uint64(500+b))
		}
		if from > 0 {
			p := uint64(500 + from - 1)
			ev.Parent = &p
		}
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		seq++
		if _, err := pub.SendMessage([]byte{}, s[:], indexer.AppendBatch(nil, indexer.EncodingMap, 1, 0, ev)); err != nil {
			t.Fatal(err)
		}
	}
	selectBody := `{"model_name":"m","token_ids":[` + strings.Join(tok, ",") + `]}`
	overlap := func() (uint64, uint64) {
		var res struct {
			WorkerID uint64 `json:"worker_id"`
			Overlap  struct {
				GPU uint64 `json:"gpu"`
			} `json:"overlap"`
		}
		callJSON(t, tester, http.MethodPost, "/select", selectBody, http.StatusOK, &res)
		return res.WorkerID, res.Overlap.GPU
	}
	waitOverlap := func(want uint64) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			w, gpu := overlap()
			if w == 1 && gpu == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("select: worker %d gpu %d, want worker 1 gpu %d", w, gpu, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	publish(0, 8)
	waitOverlap(32)

	val, ok := routers.References(routerKey)
	if !ok || val != 1 {
		t.Fatalf("router references %d", val)
	}
	gen := pooledState(t).gen()
	forceReload(t, eventsCaddyfile(pubEP)) // as caddy reload --force
	if pooledState(t).gen() != gen+1 {
		t.Fatal("the config was not reloaded")
	}
	if waitSubShort(pub) {
		t.Fatal("the reload subscribed a second time: listener duplicated")
	}
	publish(8, 16)
	waitOverlap(64)
	state := pooledState(t)
	if n := state.events.Listeners(); n != 2 {
		t.Fatalf("%d listeners after reload, want 2", n)
	}
	st := state.events.Stats().Events
	if st.Gaps != 0 || st.Restarts != 0 || st.Batches != 2 {
		t.Fatalf("after reload: gaps %d restarts %d batches %d", st.Gaps, st.Restarts, st.Batches)
	}
	// The counters are on Caddy's metrics endpoint, carried across the reload.
	res, err := tester.Client.Get(fmt.Sprintf("http://localhost:%d/metrics", testAdminPort))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{"kvrouter_kv_events_batches_total 2", "kvrouter_index_entries 16", "kvrouter_kv_event_listeners 2", "kvrouter_kv_events_gaps_total 0"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// waitSubShort reports whether a subscription arrives within half a second.
func waitSubShort(pub *zmq.Socket) bool {
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if f, err := pub.RecvBytes(0); err == nil && len(f) > 0 && f[0] == 1 {
			return true
		}
	}
	return false
}
