package cluster

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// fleetRouter is a router with n one-rank workers.
func fleetRouter(b *testing.B, n int) *selection.Router {
	b.Helper()
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = false
	r, err := selection.NewRouter(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.Close)
	for i := 1; i <= n; i++ {
		id, ep, bs := uint64(i), fmt.Sprintf("127.0.0.1:%d", 10000+i), uint32(16)
		if _, err := r.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id, Endpoint: &ep, BlockSize: &bs}); err != nil {
			b.Fatal(err)
		}
	}
	return r
}

// BenchmarkTrafficPerRequest: two replicas of a 1,024-worker fleet; each
// request (alternately on each replica) is selected and booked, its
// prefill completed and freed, as the proxy does. It reports the NATS
// messages and bytes both replicas sent per request (each is received
// once by the other replica: double them for sent + received), with
// prompts of 2,048 and 16,384 tokens. Requests here come back to back,
// so the publisher batches many per message; a proxy's requests, spread
// over time, batch less (BENCHMARKS.md has both). approx=off stops the
// approximate-index records (the baseline of what sharing them costs).
func BenchmarkTrafficPerRequest(b *testing.B) {
	for _, tokens := range []int{2048, 16384} {
		for _, approx := range []bool{true, false} {
			b.Run(fmt.Sprintf("workers=1024/prompt=%d/approx=%v", tokens, approx), func(b *testing.B) {
				benchTraffic(b, tokens, approx)
			})
		}
	}
}

func benchTraffic(b *testing.B, tokens int, approx bool) {
	{
		{
			s := natsServer(b, 0)
			routers := []*selection.Router{fleetRouter(b, 1024), fleetRouter(b, 1024)}
			reps := make([]*Replica, 2)
			for i, name := range []string{"a", "b"} {
				rep, err := Start(routers[i], Config{URLs: []string{s.ClientURL()}, Name: name, Fingerprint: 1, Version: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				defer rep.Close()
				reps[i] = rep
				if !approx {
					routers[i].SetApproxSink(nil)
				}
			}
			for reps[0].Stats().Peers != 1 || reps[1].Stats().Peers != 1 {
				time.Sleep(time.Millisecond)
			}
			blocks := tokens / 16
			isl := uint64(tokens)
			before := [2]Stats{reps[0].Stats(), reps[1].Stats()}
			b.ResetTimer()
			for i := range b.N {
				r := routers[i%2]
				hashes := make([]uint64, blocks)
				for j := range hashes {
					hashes[j] = uint64(i)<<20 | uint64(j) // each request its own prompt
				}
				resp, err := r.SelectAndReserve(&selection.SelectRequest{
					Prompt: selection.Prompt{BlockHashes: hashes, SequenceHashes: hashes, ISLTokens: &isl}})
				if err != nil {
					b.Fatal(err)
				}
				_ = r.PrefillComplete(resp.SelectionID)
				_ = r.Free(resp.SelectionID)
			}
			b.StopTimer()
			time.Sleep(50 * time.Millisecond) // let the last batch go out
			var msgs, bytes uint64
			for i, rep := range reps {
				st := rep.Stats()
				msgs += st.SentMessages - before[i].SentMessages
				bytes += st.SentBytes - before[i].SentBytes
			}
			b.ReportMetric(float64(msgs)/float64(b.N), "msgs/req")
			b.ReportMetric(float64(bytes)/float64(b.N), "bytes/req")
		}
	}
}

// BenchmarkBookingVisible: how long a booking made on replica A takes to
// show in replica B's loads, on loopback; it reports the p50 and p99.
func BenchmarkBookingVisible(b *testing.B) {
	s := natsServer(b, 0)
	a, bb := fleetRouter(b, 8), fleetRouter(b, 8)
	ra, err := Start(a, Config{URLs: []string{s.ClientURL()}, Name: "a", Fingerprint: 1, Version: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer ra.Close()
	rb, err := Start(bb, Config{URLs: []string{s.ClientURL()}, Name: "b", Fingerprint: 1, Version: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer rb.Close()
	for ra.Stats().Peers != 1 || rb.Stats().Peers != 1 {
		time.Sleep(time.Millisecond)
	}
	lat := make([]time.Duration, 0, b.N)
	isl := uint64(16)
	w := uint64(3)
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprintf("r%d", i)
		start := time.Now()
		if _, err := a.CreateReservation(&selection.ReservationRequest{SelectionID: &id, WorkerID: &w,
			Prompt: selection.Prompt{SequenceHashes: []uint64{uint64(i)}, ISLTokens: &isl}}); err != nil {
			b.Fatal(err)
		}
		for bb.Remote().Count("a") != 1 {
			time.Sleep(10 * time.Microsecond)
		}
		lat = append(lat, time.Since(start))
		_ = a.Free(id)
		for bb.Remote().Count("a") != 0 {
			time.Sleep(10 * time.Microsecond)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
