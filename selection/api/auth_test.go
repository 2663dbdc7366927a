package api

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	json "github.com/goccy/go-json"
)

// authServer serves a handler on 127.0.0.1; remote, when set, replaces
// the request's RemoteAddr (as a client elsewhere would have it).
func authServer(t *testing.T, remote string, opts ...HandlerOption) *httptest.Server {
	t.Helper()
	r := newTestRouter(t, nil)
	h := NewHandler(r, 0, opts...)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if remote != "" {
			req.RemoteAddr = remote
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	return srv
}

type authCase struct {
	name, method, path, auth, body string
	status                         int
	errSub                         string
}

func runAuthCases(t *testing.T, srv *httptest.Server, cases []authCase) {
	t.Helper()
	for _, tc := range cases {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if tc.body != "" {
			req.Header.Set("Content-Type", js)
		}
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body map[string]any
		_ = json.Unmarshal(raw, &body)
		msg, _ := body["error"].(string)
		if resp.StatusCode != tc.status || !strings.Contains(msg, tc.errSub) {
			t.Errorf("%s: %s %s: %d %s, want %d with %q", tc.name, tc.method, tc.path, resp.StatusCode, raw, tc.status, tc.errSub)
		}
		if ch := resp.Header.Get("WWW-Authenticate"); (tc.status == 401) != (ch == "Bearer") {
			t.Errorf("%s: WWW-Authenticate %q on a %d", tc.name, ch, tc.status)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: content type %q", tc.name, ct)
		}
	}
}

const worker1 = `{"worker_id":1,"endpoint":"127.0.0.1:8001","block_size":4}`

// TestAPIWriteToken: with a write token, catalog writes need it (401
// without credentials, 403 with a wrong token) from anywhere, loopback
// included; reads, selections and reservations stay open.
func TestAPIWriteToken(t *testing.T) {
	srv := authServer(t, "", WithWriteToken("s3cret"))
	runAuthCases(t, srv, []authCase{
		{"no header", "POST", "/workers", "", worker1, 401, "catalog writes need Authorization: Bearer <write token>"},
		{"another scheme", "POST", "/workers", "Basic czNjcmV0", worker1, 401, "Bearer"},
		{"an empty bearer", "POST", "/workers", "Bearer ", worker1, 401, "Bearer"},
		{"the token without a scheme", "POST", "/workers", "s3cret", worker1, 401, "Bearer"},
		{"a wrong token", "POST", "/workers", "Bearer s3cre", worker1, 403, "the write token is not valid"},
		{"a longer wrong token", "POST", "/workers", "Bearer s3cret!", worker1, 403, "not valid"},
		{"the token", "POST", "/workers", "Bearer s3cret", worker1, 201, ""},
		{"the scheme in lower case", "POST", "/workers", "bearer s3cret", worker1, 201, ""},
		{"patch without", "PATCH", "/workers/1", "", `{"total_kv_blocks":5}`, 401, "Bearer"},
		{"patch wrong", "PATCH", "/workers/1", "Bearer x", `{"total_kv_blocks":5}`, 403, "not valid"},
		{"patch", "PATCH", "/workers/1", "Bearer s3cret", `{"total_kv_blocks":5}`, 200, ""},
		{"a patch of a bad id is refused first", "PATCH", "/workers/abc", "", `{}`, 401, "Bearer"},
		{"list", "GET", "/workers", "", "", 200, ""},
		{"a read with a wrong token", "GET", "/workers", "Bearer x", "", 200, ""},
		{"select", "POST", "/select", "", `{"token_ids":[1,2,3,4]}`, 200, ""},
		{"select_and_reserve", "POST", "/select_and_reserve", "", `{"selection_id":"r1","token_ids":[1,2,3,4]}`, 200, ""},
		{"free", "DELETE", "/reservations/r1", "", "", 200, ""},
		{"loads", "GET", "/loads", "", "", 200, ""},
		{"delete without", "DELETE", "/workers/1", "", "", 401, "Bearer"},
		{"delete wrong", "DELETE", "/workers/1", "Bearer nope", "", 403, "not valid"},
		{"delete", "DELETE", "/workers/1", "Bearer s3cret", "", 200, ""},
		{"method not allowed is not a write", "PUT", "/workers", "", "{}", 405, "method not allowed"},
	})
}

// TestAPIWritesWithoutToken: with no token, catalog writes are accepted
// from loopback clients only; others get a 403 saying how to set one.
func TestAPIWritesWithoutToken(t *testing.T) {
	const howTo = "catalog writes are accepted only from loopback clients when no write token is set; set one"
	for _, tc := range []struct {
		remote string
		status int
	}{
		{"", 201}, // the real 127.0.0.1 of the test client
		{"127.3.2.1:4000", 201},
		{"[::1]:4000", 201},
		{"203.0.113.7:4000", 403},
		{"10.0.0.2:4000", 403},
		{"[2001:db8::1]:4000", 403},
		{"[fe80::1]:4000", 403},
		{"not an address", 403},
	} {
		srv := authServer(t, tc.remote)
		errSub := ""
		if tc.status == 403 {
			errSub = howTo
		}
		runAuthCases(t, srv, []authCase{
			{tc.remote + " upsert", "POST", "/workers", "", worker1, tc.status, errSub},
			{tc.remote + " select", "POST", "/select", "", `{"token_ids":[1]}`, map[bool]int{true: 200, false: 503}[tc.status == 201], ""},
			{tc.remote + " patch", "PATCH", "/workers/1", "", `{"total_kv_blocks":5}`, map[bool]int{true: 200, false: 403}[tc.status == 201], errSub},
			{tc.remote + " delete", "DELETE", "/workers/1", "", "", map[bool]int{true: 200, false: 403}[tc.status == 201], errSub},
			{tc.remote + " read", "GET", "/workers", "", "", 200, ""},
		})
	}
}
