package main

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// body builds a request body; every client has its own random prompt.
func body(mode string, tokens int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	b := []byte(`{"model_name":"default","token_ids":[`)
	if mode == "completions" {
		b = []byte(`{"model":"default","max_tokens":1,"prompt":[`)
	}
	for i := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(rng.IntN(150000)), 10)
	}
	return append(b, "]}"...)
}

// cpuTicks reads a process's user+system CPU time in clock ticks (1/100 s).
func cpuTicks(pid int) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return ut + st, nil
}

func run(mode, url string, tokens, requests, conc, pid int, reserve bool) error {
	path := "/select"
	switch {
	case mode == "completions":
		path, reserve = "/v1/completions", false
	case reserve:
		path = "/select_and_reserve"
	}
	bodies := make([][]byte, conc)
	for i := range bodies {
		bodies[i] = body(mode, tokens, uint64(i+1))
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
	var cpu0 int64
	if pid > 0 {
		var err error
		if cpu0, err = cpuTicks(pid); err != nil {
			return err
		}
	}
	var mu sync.Mutex
	var lat []time.Duration
	var errs int
	var firstErr error
	next := make(chan int)
	go func() {
		for i := range requests {
			next <- i
		}
		close(next)
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				t0 := time.Now()
				err := post(client, url+path, bodies[c], reserve, url)
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					errs++
					if firstErr == nil {
						firstErr = err
					}
				} else {
					lat = append(lat, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	slices.Sort(lat)
	q := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	fmt.Printf("requests %d  errors %d  body %d bytes  concurrency %d\n", requests, errs, len(bodies[0]), conc)
	fmt.Printf("throughput %.1f req/s  latency p50 %v  p90 %v  p99 %v\n",
		float64(len(lat))/wall.Seconds(), q(0.5).Round(time.Microsecond), q(0.9).Round(time.Microsecond), q(0.99).Round(time.Microsecond))
	if pid > 0 {
		cpu1, err := cpuTicks(pid)
		if err != nil {
			return err
		}
		perReq := time.Duration(cpu1-cpu0) * 10 * time.Millisecond / time.Duration(max(requests, 1))
		fmt.Printf("gateway CPU %.2f s over %d requests = %v per request\n", float64(cpu1-cpu0)/100, requests, perReq)
	}
	if errs > 0 {
		return fmt.Errorf("%d requests failed; first: %v", errs, firstErr)
	}
	return nil
}

func post(c *http.Client, url string, body []byte, free bool, base string) error {
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %s", resp.StatusCode, raw)
	}
	if !free {
		return nil
	}
	// Free the booking so load does not pile up across the run.
	i := bytes.Index(raw, []byte(`"selection_id":"`))
	if i < 0 {
		return fmt.Errorf("no selection_id in %s", raw)
	}
	id := raw[i+len(`"selection_id":"`):]
	id = id[:bytes.IndexByte(id, '"')]
	req, _ := http.NewRequest(http.MethodDelete, base+"/reservations/"+string(id), nil)
	r2, err := c.Do(req)
	if err != nil {
		return err
	}
	r2.Body.Close()
	return nil
}
