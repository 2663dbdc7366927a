package selection

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestRequestMembersBounded: a select request's lists and maps are counted
// before goccy decodes them; one over its bound is a 422 naming it, with
// little allocated for it (decoded, a 7.5 MB allowed_worker_ids held
// 106 MB), and one at its bound is decoded whole.
func TestRequestMembersBounded(t *testing.T) {
	list := func(n int, elem func(i int) string) string {
		var b strings.Builder
		b.WriteByte('[')
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(elem(i))
		}
		b.WriteByte(']')
		return b.String()
	}
	taints := func(n int) string {
		var b strings.Builder
		b.WriteByte('{')
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"t` + strconv.Itoa(i) + `":1`)
		}
		b.WriteByte('}')
		return b.String()
	}
	id := func(i int) string { return strconv.Itoa(i) }
	empty := func(int) string { return "{}" }
	for _, c := range []struct {
		name, body string
		refused    bool
		got        func(r *SelectRequest) int
	}{
		{"allowed_worker_ids at the bound", `{"allowed_worker_ids":` + list(maxAllowedWorkerIDs, id) + `}`, false,
			func(r *SelectRequest) int { return len(r.AllowedWorkerIDs) }},
		{"allowed_worker_ids", `{"allowed_worker_ids":` + list(3_750_000, func(int) string { return "1" }) + `}`, true, nil},
		{"required_taints at the bound", `{"routing_constraints":{"required_taints":` + list(maxRequiredTaints, func(i int) string { return `"t` + id(i) + `"` }) + `}}`, false,
			func(r *SelectRequest) int { return len(r.RoutingConstraints.RequiredTaints) }},
		{"required_taints", `{"routing_constraints":{"required_taints":` + list(maxRequiredTaints+1, func(int) string { return `"a,b"` }) + `}}`, true, nil},
		{"preferred_taints at the bound", `{"routing_constraints":{"preferred_taints":` + taints(maxPreferredTaints) + `}}`, false,
			func(r *SelectRequest) int { return len(r.RoutingConstraints.PreferredTaints) }},
		{"preferred_taints", `{"routing_constraints":{"preferred_taints":` + taints(400_000) + `}}`, true, nil},
		{"block_mm_infos", `{"block_mm_infos":` + list(2_000_000, empty) + `}`, true, nil},
		{"mm_routing_info.block_mm_infos", `{"mm_routing_info":{"block_mm_infos":` + list(2_000_000, empty) + `}}`, true, nil},
		// Each empty object is two values: its separator and its opening.
		{"block_mm_infos at the bound", `{"block_mm_infos":` + list(maxMMValues/2, empty) + `}`, false,
			func(r *SelectRequest) int { return len(r.BlockMMInfos) }},
	} {
		var r SelectRequest
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := DecodeJSON([]byte(c.body), &r)
		runtime.ReadMemStats(&after)
		if !c.refused {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			} else if n, want := c.got(&r), strings.Count(c.body, ",")+1; n != want {
				t.Errorf("%s: %d entries decoded", c.name, n)
			}
			continue
		}
		e, ok := err.(*Error)
		if !ok || e.Kind != KindUnprocessable || !strings.Contains(e.Msg, "more than") {
			t.Errorf("%s: %v, want a 422 for its size", c.name, err)
			continue
		}
		// A few KiB of the decoder's own, whatever the body.
		if grown := after.TotalAlloc - before.TotalAlloc; grown > 4*uint64(len(c.body))+64<<10 {
			t.Errorf("%s: refusing a %d-byte body allocated %d bytes", c.name, len(c.body), grown)
		}
	}
}
