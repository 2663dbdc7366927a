package main

import (
	"io"
	"net/http"
)

// sink serves a tiny completion for every request, after reading its body.
func sink(addr string) error {
	reply := []byte(`{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":1}}`)
	return http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(reply)
	}))
}
