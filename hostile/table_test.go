package hostile

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// attack is one line of the table: what is done, what the gateway must
// answer, and the function that does it and reports what it answered.
type attack struct {
	id       string // the subtest's name
	name     string // the table's
	expected string
	// same runs the attack on the previous attack's gateway, whose state it
	// needs (the flooded index); every other attack gets a fresh gateway,
	// so that one attack's damage is not the next one's starting point.
	same bool
	// rss is the RSS bound, when not rssLimit.
	rss int64
	// bind starts the attack's gateway with a KV-event endpoint that
	// publishers dial (kv_events_bind); it is never the previous one's.
	bind bool
	run  func(*run) result
}

var attacks = []attack{
	{id: "1a_dp_size_4294967295", name: "1. POST /workers data_parallel_size 4294967295",
		expected: "422, alive", run: registerDPSize(4294967295, true)},
	{id: "1b_dp_size_1000000", name: "1. POST /workers data_parallel_size 1000000",
		expected: "422", run: registerDPSize(1000000, false)},
	{id: "1c_10000_rank_listeners", name: "1. 10,000 ranks with kv_events_endpoints",
		expected: "422", run: tenThousandRanks},
	{id: "1d_rank_total", name: fmt.Sprintf("1. workers of %d ranks until max_ranks %d", maxRanksPerWorker, maxRanks),
		expected: fmt.Sprintf("409 past %d ranks", maxRanks), run: rankTotal},
	{id: "2a_writes_without_token", name: "2. catalog writes (POST, PUT, PATCH, DELETE) without a token",
		expected: "401", run: catalogWrites("", 401)},
	{id: "2b_writes_wrong_token", name: "2. catalog writes with a wrong token",
		expected: "403", run: catalogWrites("wrong", 403)},
	{id: "2c_1MiB_model_name", name: "2. a 1 MiB model_name",
		expected: "422 or 413", run: oversizedField("model_name", strings.Repeat("m", 1<<20))},
	{id: "2d_100k_taints", name: "2. 100,000 taints",
		expected: "422 or 413", run: oversizedField("taints", manyTaints(100000))},
	{id: "3a_endpoint_admin", name: "3. endpoint = Caddy's admin listener",
		expected: "422 with a reason", run: selfEndpoint(func(g *gateway) string { return fmt.Sprintf("127.0.0.1:%d", g.ports.admin) })},
	{id: "3b_endpoint_proxy", name: "3. endpoint = the gateway's proxy listener", same: true,
		expected: "422 with a reason", run: selfEndpoint(func(g *gateway) string { return fmt.Sprintf("127.0.0.1:%d", g.ports.proxy) })},
	{id: "3c_endpoint_selection_api", name: "3. endpoint = the selection API listener", same: true,
		expected: "422 with a reason", run: selfEndpoint(func(g *gateway) string { return fmt.Sprintf("127.0.0.1:%d", g.ports.api) })},
	{id: "3d_endpoint_localhost_admin", name: "3. endpoint = localhost:<admin port>", same: true,
		expected: "422 with a reason", run: selfEndpoint(func(g *gateway) string { return fmt.Sprintf("localhost:%d", g.ports.admin) })},
	{id: "4_upsert_new_endpoint", name: "4. upsert a worker holding a session's prefix with a new endpoint",
		expected: "cached 0, no stale index", run: endpointSwap},
	{id: "5a_kill_fleet", name: "5. kill the whole fleet",
		expected: "502s stop, then 503 in OpenAI shape", run: killFleet},
	{id: "5b_worker_only_503", name: "5. a worker answering only 503 (holding the prefix)",
		expected: "taken out", run: only503Worker},
	{id: "6a_three_400MB_frames", name: "6. three 400 MB ZMQ frames",
		expected: "dropped and counted", run: bigFrames},
	{id: "6b_index_flood", name: fmt.Sprintf("6. %d stored blocks against index_max_memory %d MiB", floodBlocks, indexBudget>>20),
		expected: "evicted and counted, the other worker's blocks kept", rss: indexBudget + 100<<20, run: flood},
	{id: "6c_dump_flooded_index", name: "6. GET /dump of the flooded index", same: true,
		expected: fmt.Sprintf("capped at %d events", maxDumpEvents), run: dump},
	{id: "6d_delete_flooders", name: "6. delete the flooding worker", same: true,
		expected: "RSS falls", run: deleteFlooders},
	{id: "7_unfreed_reservations", name: "7. 3,000 select_and_reserve never freed",
		expected: fmt.Sprintf("429 past %d", maxReservationsPerClient), run: reservations},
	{id: "8a_sequence_jump", name: "8. sequence jump to 2^63",
		expected: "lost_total bounded, counted as jump/restart", run: seqJump},
	{id: "8b_unknown_dp_rank", name: "8. batches naming a dp_rank the worker lacks",
		expected: "dropped and counted, no entries", run: unknownRank},
	{id: "8c_bind_foreign_topic", name: "8. in bind mode, a publisher on another host sends under worker 1's topic: removes its blocks, stores 1,000", bind: true,
		expected: "cut and counted, the worker's blocks unchanged", run: foreignTopic},
	{id: "9a_unserved_model", name: "9. completion for a model no worker serves",
		expected: "404 OpenAI shape, no worker hit", run: unservedModel},
	{id: "9b_hanging_worker", name: "9. a worker hanging before headers",
		expected: fmt.Sprintf("504 after %s", responseHeaderTimeout), run: hangingWorker},
	{id: "10a_content_length_lies", name: fmt.Sprintf("10. %d connections to each listener declaring its body limit, sending 13 bytes", lyingConnsPerListener),
		expected: "held, heap bounded", run: lyingLengths},
	{id: "10b_4MB_selection_id", name: "10. select_and_reserve with a 4 MB selection_id",
		expected: "400", run: longSelectionID},
	{id: "10c_long_prompt_bookings", name: fmt.Sprintf("10. select_and_reserve of 4M-token prompts until refused, max_reservation_blocks_per_client %d", maxReservationBlocks),
		expected: fmt.Sprintf("429 past %d blocks", maxReservationBlocks), run: longPrompts},
	{id: "10d_model_in_other_case", name: `10. "model" unserved, "MODEL" served`,
		expected: "404, no worker hit", run: foldedModel},
}

func manyTaints(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("taint-%d", i)
	}
	return out
}

// row is an attack as it went.
type row struct {
	attack
	observed, detail string
	before, after    usage
	peakRSS          int64
	peakFDs          int
	took             time.Duration
	failed           bool
}

// TestHostile plays every attack against the built gateway and prints the
// table. Each attack is a subtest: one that fails does not stop the others.
func TestHostile(t *testing.T) {
	start := time.Now()
	var (
		g    *gateway
		sh   *shared
		rows []*row
	)
	defer func() {
		if g != nil {
			g.Stop()
		}
	}()
	for _, a := range attacks {
		rw := &row{attack: a, observed: "aborted"}
		ran := false
		t.Run(a.id, func(st *testing.T) {
			ran = true
			// The gateway starts here, not before t.Run, so that a -run
			// filter skips the gateways of the attacks it leaves out. It
			// belongs to the parent test: the next attack may need it.
			if !a.same || a.bind || g == nil || !g.Alive() {
				if g != nil {
					g.Stop()
				}
				var err error
				if g, err = startGateway(t, a.bind); err != nil {
					g = nil
					rw.observed, rw.failed = "the gateway did not start", true
					st.Fatal(err)
				}
				sh = &shared{}
			}
			play(st, rw, g, sh)
		})
		if ran {
			rows = append(rows, rw)
		}
	}
	printTable(rows, time.Since(start))
}

// play runs one attack and judges it: the answer, the process, its RSS and
// its fds. It fills rw even when the attack aborts (t.Fatal unwinds
// through the deferred judgement).
func play(t *testing.T, rw *row, g *gateway, sh *shared) {
	r := &run{t: t, g: g, sh: sh, before: usageOf(g.pid)}
	rw.before = r.before
	s := startSampler(g.pid)
	start := time.Now()
	defer func() {
		rw.took = time.Since(start)
		rw.peakRSS, rw.peakFDs = s.finish()
		rw.after = usageOf(g.pid)
		if r.aborted != "" {
			rw.observed, rw.detail = "harness: "+r.aborted, ""
		}
		limit := int64(rssLimit)
		if rw.rss > 0 {
			limit = rw.rss
		}
		if !g.Alive() {
			t.Errorf("the gateway exited: %s (its log: %s)", g.ExitReason(), g.LogPath)
			if !strings.Contains(rw.observed, "exited") {
				rw.observed += ", exited"
			}
			rw.detail += "; the process exited: " + g.ExitReason()
		}
		if rw.observed != rw.expected {
			t.Errorf("observed %q, expected %q (%s)", rw.observed, rw.expected, rw.detail)
		}
		if rw.peakRSS > limit {
			t.Errorf("RSS reached %s, over its bound of %s", mb(rw.peakRSS), mb(limit))
		}
		if rw.peakFDs >= fdLimit {
			t.Errorf("open fds reached %d (bound %d)", rw.peakFDs, fdLimit)
		}
		rw.failed = t.Failed()
	}()
	res := rw.run(r)
	rw.observed, rw.detail = res.answer, res.detail
}

// printTable writes the table in Markdown, ready for RELIABILITY.md.
func printTable(rows []*row, took time.Duration) {
	var b strings.Builder
	mode := ""
	if baseline {
		mode = ", baseline config (no issue-10 options)"
	}
	fmt.Fprintf(&b, "\nHostile inputs against %s (%d CPUs%s), %s in all\n\n", gatewayPath(), runtime.NumCPU(), mode, took.Round(time.Second))
	b.WriteString("| attack | expected | observed | RSS MB before → after (peak) | fds before → after (peak) | time | result |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		obs := r.observed
		if r.detail != "" {
			obs += "; " + r.detail
		}
		verdict := "ok"
		if r.failed {
			verdict = "**FAIL**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.1fs | %s |\n", r.name, r.expected, strings.ReplaceAll(obs, "|", "\\|"),
			span(r.before, r.after, func(u usage) string { return fmt.Sprintf("%.0f", float64(u.rss)/(1<<20)) }, fmt.Sprintf("%.0f", float64(r.peakRSS)/(1<<20))),
			span(r.before, r.after, func(u usage) string { return fmt.Sprint(u.fds) }, fmt.Sprint(r.peakFDs)),
			r.took.Seconds(), verdict)
	}
	fmt.Fprint(os.Stdout, b.String())
}

// span is "before → after (peak)", with "exited" for a process gone.
func span(before, after usage, f func(usage) string, peak string) string {
	show := func(u usage) string {
		if !u.ok {
			return "exited"
		}
		return f(u)
	}
	return fmt.Sprintf("%s → %s (%s)", show(before), show(after), peak)
}
