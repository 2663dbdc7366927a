package selection

import (
	"errors"
	"fmt"
	"net/http"
)

// Kind classifies an error the way Dynamo's selection service does, so that the
// HTTP layer and embedded callers map it to the same status.
type Kind int

// The error kinds, each with the HTTP status it maps to (docs/selection-api.md,
// "Errors").
const (
	KindInternal         Kind = iota // 500
	KindBadRequest                   // 400
	KindNotFound                     // 404
	KindConflict                     // 409
	KindNotReady                     // 503
	KindOverloaded                   // 429
	KindUnprocessable                // 422: well-formed JSON of the wrong shape
	KindMalformed                    // 400: JSON syntax error
	KindUnsupportedMedia             // 415
	KindTooLarge                     // 413
	KindUnauthorized                 // 401: no credentials for a privileged route
	KindForbidden                    // 403: wrong credentials, or a client not allowed
)

// Error is the error type every Router method returns for a failure a caller
// can act on. Its message is the text of the JSON error body.
type Error struct {
	Kind Kind
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Status is the HTTP status code for the error.
func (e *Error) Status() int {
	switch e.Kind {
	case KindBadRequest, KindMalformed:
		return http.StatusBadRequest
	case KindNotFound:
		return http.StatusNotFound
	case KindConflict:
		return http.StatusConflict
	case KindNotReady:
		return http.StatusServiceUnavailable
	case KindOverloaded:
		return http.StatusTooManyRequests
	case KindUnprocessable:
		return http.StatusUnprocessableEntity
	case KindUnsupportedMedia:
		return http.StatusUnsupportedMediaType
	case KindTooLarge:
		return http.StatusRequestEntityTooLarge
	case KindUnauthorized:
		return http.StatusUnauthorized
	case KindForbidden:
		return http.StatusForbidden
	}
	return http.StatusInternalServerError
}

func errorf(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

// StatusOf returns the HTTP status for any error: the mapped status for an
// *Error, 500 otherwise.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status()
	}
	return http.StatusInternalServerError
}

// errNoSchedulable is the 503 for a partition with no schedulable rank.
func errNoSchedulable(model, group string) *Error {
	return errorf(KindNotReady, "no schedulable workers for %s:%s", model, group)
}
