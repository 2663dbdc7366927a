package api

import (
	"bufio"
	"net/http"
)

// serveDump streams GET /dump through a buffered writer: an index can
// hold millions of blocks, so the body is never built whole
// (docs/selection-api.md, "GET /dump"). Once the status is sent a write
// error can only end it.
//
// One dump runs at a time; a request waits for its turn, or until its
// client goes. A dump holds one partition's events (up to max_dump_events,
// about 15 MB at the default) while its client reads them, and walks the
// partition under its read lock: a hundred dumps that were never read
// held 2.3 GB, and eight in a loop took both cores.
func (h *Handler) serveDump(w http.ResponseWriter, r *http.Request) {
	select {
	case h.dumping <- struct{}{}:
		defer func() { <-h.dumping }()
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 32<<10)
	if err := h.router.Queries().WriteDump(bw); err == nil {
		_ = bw.Flush()
	}
}
