package api

import (
	"bufio"
	"net/http"
	"time"
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
//
// Since the turn is held while the client reads, a client that stopped
// reading held it for as long as it kept its connection open, and every
// other dump waited: each write must now be taken within
// dumpWriteTimeout, and the whole dump within dumpTimeout, or the dump
// ends there (the client sees a cut chunked body) and the next one runs.
func (h *Handler) serveDump(w http.ResponseWriter, r *http.Request) {
	select {
	case h.dumping <- struct{}{}:
		defer func() { <-h.dumping }()
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	dw := &deadlineWriter{w: w, rc: http.NewResponseController(w), each: h.dumpWriteTimeout, end: time.Now().Add(h.dumpTimeout)}
	bw := bufio.NewWriterSize(dw, 32<<10)
	if err := h.router.Queries().WriteDump(bw); err == nil {
		_ = bw.Flush()
	}
	_ = dw.rc.SetWriteDeadline(time.Time{}) // the connection may serve more requests
}

// The dump's write bounds: a client must take each 32 KiB within
// dumpWriteTimeout and the whole dump within dumpTimeout. A replica's dump
// of the default 100,000 events (about 15 MB) takes well under a second
// on a LAN.
const (
	dumpWriteTimeout = 10 * time.Second
	dumpTimeout      = 2 * time.Minute
)

// deadlineWriter sets the connection's write deadline before each write:
// each write within each, and none past end.
type deadlineWriter struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	each time.Duration
	end  time.Time
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	// An error (a writer that cannot set deadlines) leaves the write
	// unbounded, as before.
	deadline := time.Now().Add(d.each)
	if d.end.Before(deadline) {
		deadline = d.end
	}
	_ = d.rc.SetWriteDeadline(deadline)
	n, err := d.w.Write(p)
	if err == nil {
		// The response writer buffers: flush, so that this write's
		// deadline, not the next one's, covers its bytes.
		err = d.rc.Flush()
	}
	return n, err
}
