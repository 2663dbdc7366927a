package api

import (
	"strconv"
	"strings"
	"testing"
)

// TestAPIWorstCaseBodies sends the bodies issue 6 names as the worst a
// client can send to /select: each gets a clear status and message (never
// a 500), and the service answers normally afterwards.
func TestAPIWorstCaseBodies(t *testing.T) {
	srv, _ := apiServer(t, 16<<20)
	if res := call(t, srv, "POST", "/workers", js, `{"worker_id":1,"endpoint":"127.0.0.1:8001","block_size":16}`); res.status != 201 {
		t.Fatalf("upsert: %d %s", res.status, res.raw)
	}
	// 8 MiB of tokens: 1,048,576 seven-digit ids and their commas.
	var eight strings.Builder
	eight.WriteString(`{"token_ids":[`)
	for i := range 1 << 20 {
		if i > 0 {
			eight.WriteByte(',')
		}
		eight.WriteString(strconv.Itoa(1_000_000 + i%9_000_000))
	}
	eight.WriteString(`]}`)
	deep := `{"x":` + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + `,"token_ids":[1]}`
	override := func(v string) string {
		return `{"token_ids":[1,2,3],"router_config_override":{"prefill_load_scale":` + v + `}}`
	}
	tests := []struct {
		name, body string
		status     int
		errSub     string
	}{
		{"8 MiB of tokens", eight.String(), 200, ""},
		{"100,000-deep nesting", deep, 400, "Failed to parse the request body as JSON"},
		{"a token id past u32", `{"token_ids":[1,4294967296]}`, 422, "token_ids[1]"},
		{"a 30-digit token id", `{"token_ids":[` + strings.Repeat("9", 30) + `]}`, 422, "token_ids[0]"},
		{"a token id of 1e400", `{"token_ids":[1e400]}`, 422, "token_ids[0]"},
		// Every occurrence of a duplicate key is checked, so a bad one
		// cannot hide behind a good one.
		{"duplicate keys", `{"token_ids":[-1],"token_ids":[1,2]}`, 422, "token_ids[0]"},
		{"NaN in an override", override("NaN"), 400, "Failed to parse the request body as JSON"},
		{"Infinity in an override", override("Infinity"), 400, "Failed to parse the request body as JSON"},
		{"an override of 1e999", override("1e999"), 422, "Failed to deserialize the JSON body"},
		{"a negative override", override("-1"), 400, "must be finite and non-negative"},
		{"invalid UTF-8 in the model name", "{\"model_name\":\"\xff\xfe\",\"token_ids\":[1]}", 400, "invalid unicode code point"},
	}
	for _, tc := range tests {
		res := call(t, srv, "POST", "/select", js, tc.body)
		msg, _ := res.body["error"].(string)
		if res.status != tc.status || !strings.Contains(msg, tc.errSub) {
			t.Errorf("%s: status %d error %q, want %d with %q", tc.name, res.status, msg, tc.status, tc.errSub)
		}
		if tc.status == 200 && res.body["worker_id"] != 1.0 {
			t.Errorf("%s: %.200s", tc.name, res.raw)
		}
	}
	// Under the default 8 MiB limit the same tokens are refused whole.
	small, _ := apiServer(t, 0)
	if res := call(t, small, "POST", "/select", js, eight.String()); res.status != 413 {
		t.Errorf("8 MiB under the default limit: %d %.200s", res.status, res.raw)
	}
	if res := call(t, srv, "POST", "/select", js, `{"token_ids":[1,2,3]}`); res.status != 200 {
		t.Fatalf("after the worst cases: %d %s", res.status, res.raw)
	}
}
