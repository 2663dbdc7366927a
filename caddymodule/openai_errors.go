package caddymodule

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The proxy path's own errors. Clients of the OpenAI routes (the openai
// SDKs, vLLM's benchmark tools) parse failures as OpenAI's error object,
// {"error":{"message","type","code"}}; an empty body or Caddy's plain text
// makes them report a decoding error instead of the cause. So the kv_router
// handler writes the errors it decides (400, 404, 413, 422, 503) and the
// upstream failures reverse_proxy returns to it (502, 503, 504) in that
// shape itself, rather than handing them to Caddy's error routes. Answers a
// worker gave are passed through untouched.

// openAIError is the body of an error answer.
type openAIError struct {
	Error openAIErrorBody `json:"error"`
}

type openAIErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    int    `json:"code"`
}

// openAIErrorType names the error class of a status the way OpenAI's API
// does, so that SDKs map it to their exception classes.
func openAIErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		return "invalid_request_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable:
		return "service_unavailable_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	return "api_error"
}

// writeOpenAIError answers status with message in OpenAI's error shape.
func writeOpenAIError(w http.ResponseWriter, status int, message string) {
	b, _ := json.Marshal(openAIError{Error: openAIErrorBody{Message: message, Type: openAIErrorType(status), Code: status}})
	h := w.Header()
	// The worker headers set before reverse_proxy failed name a worker
	// that did not answer.
	h.Del("X-KVRouter-Worker")
	h.Del("X-KVRouter-Cached-Tokens")
	h.Del("X-KVRouter-Explain")
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// proxyFailure reports whether err is a failure reverse_proxy returned
// for a worker (no answer, or none in time) and its status.
func proxyFailure(err error) (int, bool) {
	var he caddyhttp.HandlerError
	if !errors.As(err, &he) {
		return 0, false
	}
	switch he.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return he.StatusCode, true
	}
	return 0, false
}

// proxyFailureMessage is the client-facing text of a proxy failure: the
// status says what happened; the upstream's address and Go's error text
// stay in the logs.
func proxyFailureMessage(status int) string {
	switch status {
	case http.StatusGatewayTimeout:
		return "the worker did not answer in time"
	case http.StatusServiceUnavailable:
		return "no worker is available for this request"
	}
	return "the worker could not be reached"
}
