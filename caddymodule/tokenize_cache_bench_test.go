package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// BenchmarkTokenizeCache: what a cache hit saves the gateway on a
// 100k-token chat prompt, against asking a worker's /tokenize over
// loopback HTTP. The worker here answers a precomputed body at once, so
// the difference is the gateway's own side of the call (the request, the
// answer's 100k tokens read and decoded) and a lower bound of the saving:
// a real engine renders the template and tokenizes on top.
//
//	go test -run '^$' -bench TokenizeCache -benchtime 200x ./caddymodule/
func BenchmarkTokenizeCache(b *testing.B) {
	const n = 100_000
	var answer strings.Builder
	answer.WriteString(`{"count":` + strconv.Itoa(n) + `,"max_model_len":131072,"tokens":[`)
	for i := range n {
		if i > 0 {
			answer.WriteByte(',')
		}
		answer.WriteString(strconv.Itoa(1000 + i%120000))
	}
	answer.WriteString(`]}`)
	body := []byte(answer.String())
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write(body)
	}))
	defer srv.Close()

	id, model, ep, bs := uint64(1), "m", strings.TrimPrefix(srv.URL, "http://"), uint32(16)
	router := routerWith(b, nil, selection.WorkerRequest{WorkerID: &id, ModelName: &model, Endpoint: &ep, BlockSize: &bs})
	p := selection.Partition{ModelName: model}
	part := p.Key()
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", n) + `"}],"add_generation_prompt":true,"add_special_tokens":false}`)
	for _, c := range []struct {
		name  string
		cache int
	}{{"off", 0}, {"on", 4 << 20}} {
		b.Run(c.name, func(b *testing.B) {
			tk := newTokenizer(router, 10*time.Second, c.cache)
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				toks, err := tk.tokenize(context.Background(), part, "", chat, false)
				if err != nil || len(toks) != n {
					b.Fatal(fmt.Sprint(len(toks), err))
				}
			}
		})
	}
}
