package api

import (
	"net/url"
	"testing"
)

// TestAPIReservationIDsWithSlashes: a selection id may hold a slash (as
// "conv-1/turn-3" would); sent escaped in the path, it names its booking,
// which is then freed, where the decoded path was split at the slash and
// the booking held its rank's load until reservation_ttl. An empty id,
// which no route can name, is refused at booking.
func TestAPIReservationIDsWithSlashes(t *testing.T) {
	srv, r := apiServer(t, 0)
	addWorker(t, r, 1, nil)
	for _, id := range []string{"a/b", "x/", "conv-1/turn-3/", "%2F"} {
		res := call(t, srv, "POST", "/select_and_reserve", js, `{"token_ids":[1,2,3],"selection_id":"`+id+`"}`)
		if res.status != 200 {
			t.Fatalf("book %q: %d %s", id, res.status, res.raw)
		}
		path := "/reservations/" + url.PathEscape(id)
		if res := call(t, srv, "POST", path+"/prefill_complete", "", ""); res.status != 200 {
			t.Fatalf("prefill_complete %q at %s: %d %s", id, path, res.status, res.raw)
		}
		if res := call(t, srv, "DELETE", path, "", ""); res.status != 200 {
			t.Fatalf("free %q at %s: %d %s", id, path, res.status, res.raw)
		}
		if res := call(t, srv, "DELETE", path, "", ""); res.status != 404 {
			t.Fatalf("free %q again: %d %s, want 404", id, res.status, res.raw)
		}
	}
	res := call(t, srv, "POST", "/reservations", js, `{"selection_id":"","worker_id":1,"sequence_hashes":[1],"isl_tokens":16}`)
	if res.status != 400 {
		t.Fatalf("an empty selection_id: %d %s, want 400", res.status, res.raw)
	}
}
