package hostile

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// --- 10. Claims that cost what they claim (a black-box probe, session 15) ---

// lyingConnsPerListener is how many connections lyingLengths opens to each
// of the proxy and the selection API.
const lyingConnsPerListener = 100

// lyingLengths opens connections to the proxy and to the selection API,
// each sending request headers that declare the listener's whole body
// limit (16 MiB, 8 MiB) and then 13 bytes of the body, and holds them.
// When a body's buffer was sized from its declared length, these 200
// connections made the gateway allocate 2.4 GB. The attack reads Go's
// heap in use, not RSS: a fresh allocation's untouched pages are not
// resident until the heap reuses them (the probe's three rounds of 120
// connections took RSS from 60 MB to 2.2 GB).
func lyingLengths(r *run) result {
	targets := []struct {
		port     int
		path     string
		declared int
	}{{r.g.ports.proxy, "/v1/completions", 16 << 20}, {r.g.ports.api, "/select", 8 << 20}}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	heapBefore, err := r.g.metric("go_memstats_heap_inuse_bytes")
	if err != nil {
		r.fatalf("reading the gateway's metrics: %v", err)
	}
	for _, tg := range targets {
		for range lyingConnsPerListener {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", tg.port))
			if err != nil {
				r.fatalf("dialing the gateway: %v", err)
			}
			conns = append(conns, c)
			if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":\"m\",",
				tg.path, tg.declared); err != nil {
				r.fatalf("writing a request: %v", err)
			}
		}
	}
	// Time for the gateway to take every connection and read its bytes;
	// the sampler meanwhile records the RSS that play bounds.
	time.Sleep(2 * time.Second)
	waiting := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
			waiting++ // no answer yet: the gateway is still waiting for the body
		}
	}
	heap, err := r.g.metric("go_memstats_heap_inuse_bytes")
	if err != nil {
		r.fatalf("reading the gateway's metrics: %v", err)
	}
	grew := int64(heap - heapBefore)
	detail := fmt.Sprintf("%d connections declaring 16 MiB (proxy) or 8 MiB (selection API), 13 bytes sent each; %d still waiting for their bodies after 2 s; Go heap in use %s before, %s while held",
		len(conns), waiting, mb(int64(heapBefore)), mb(int64(heap)))
	switch {
	case waiting != len(conns):
		return result{fmt.Sprintf("%d of %d answered early", len(conns)-waiting, len(conns)), detail}
	case grew > 100<<20:
		return result{fmt.Sprintf("heap grew %s", mb(grew)), detail}
	}
	return result{"held, heap bounded", detail}
}

// longSelectionID books a request under a 4 MB selection id: a booking
// keeps its id for reservation_ttl, so 1,024 of them per client address
// held 6.5 GB before ids were bounded.
func longSelectionID(r *run) result {
	r.worker(1, vllm, false)
	body, _ := json.Marshal(map[string]any{"model_name": model, "token_ids": tokens(100, 32),
		"selection_id": strings.Repeat("i", 4<<20)})
	a := call(slow, http.MethodPost, r.g.api+"/select_and_reserve", body, nil)
	held := r.stats()["active_reservations"]
	return result{a.code(), fmt.Sprintf("%s; %.0f reservations held", answerNote(a), held)}
}

// longPrompts books prompts of 4M tokens (the most an 8 MiB body of
// one-digit ids carries: 250,000 blocks each) until the gateway refuses.
// A booking keeps its prompt's blocks until it is freed or expires, about
// 24 bytes each: the probe's 40 such bookings held 240 MB, and the 1,024
// a client may hold would have held 6 GB.
func longPrompts(r *run) result {
	r.worker(1, vllm, false)
	const ids = 4_000_000
	body := make([]byte, 0, 2*ids+64)
	body = append(body, `{"model_name":"`+model+`","token_ids":[`...)
	for i := range ids {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, '0')
	}
	body = append(body, "]}"...)
	perBooking := ids / blockSize
	booked, first := 0, answer{}
	for range maxReservationBlocks/perBooking + 2 {
		a := call(slow, http.MethodPost, r.g.api+"/select_and_reserve", body, nil)
		if a.status/100 != 2 {
			first = a
			break
		}
		booked++
	}
	detail := fmt.Sprintf("%d bookings of %d blocks accepted (bound %d blocks), then %s; %s",
		booked, perBooking, maxReservationBlocks, answerNote(first), r.g.goMemory())
	if first.status == http.StatusTooManyRequests && booked == maxReservationBlocks/perBooking {
		return result{fmt.Sprintf("429 past %d blocks", maxReservationBlocks), detail}
	}
	return result{fmt.Sprintf("%d booked, then %s", booked, first.code()), detail}
}

// foldedModel asks for a model no worker serves under "model" and for the
// served one under "MODEL". An engine reads the exact name only (vLLM's
// request models), so the request is for the unserved model: a 404 that
// reaches no worker, as attack 9 expects of any unserved model. Read with
// case folded, the gateway routed it as the served model, to a worker
// that then answered for the other.
func foldedModel(r *run) result {
	ws := []*worker{r.worker(1, vllm, false), r.worker(2, vllm, false)}
	body := []byte(`{"model":"no-such-model","MODEL":"` + model + `","prompt":[1,2,3,4],"max_tokens":4}`)
	a := call(slow, http.MethodPost, r.g.proxy+"/v1/completions", body, nil)
	hits := ws[0].completions.Load() + ws[1].completions.Load()
	ans := a.code()
	if hits == 0 {
		ans += ", no worker hit"
	} else {
		ans += fmt.Sprintf(", %d reached workers", hits)
	}
	return result{ans, clip(string(a.body), 120)}
}
