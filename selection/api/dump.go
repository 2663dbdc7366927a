package api

import (
	"bufio"
	"net/http"
)

// serveDump streams GET /dump through a buffered writer: an index can
// hold millions of blocks, so the body is never built whole
// (docs/selection-api.md, "GET /dump"). Once the status is sent a write
// error can only end it.
func (h *Handler) serveDump(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 32<<10)
	if err := h.router.Queries().WriteDump(bw); err == nil {
		_ = bw.Flush()
	}
}
