package main

import (
	"reflect"
	"strings"

	json "github.com/goccy/go-json"
)

// vLLM's request models (pydantic) read a member under its exact name
// only and ignore other names as extras, where goccy/go-json, like
// encoding/json, also takes "MODEL" for "model". kvmock reads as vLLM
// does: a top-level member whose name matches one of apiRequest's only
// with case folded is dropped before decoding. (The gateway's decoder
// does the same in its own way; kvmock, as the engine the gateway is
// tested against, shares no code with it.)

// apiNames are apiRequest's JSON member names.
var apiNames = func() []string {
	t := reflect.TypeFor[apiRequest]()
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}()

// foldedOnly reports whether name is none of apiNames but equals one with
// case folded.
func foldedOnly(name string) bool {
	folded := false
	for _, n := range apiNames {
		if name == n {
			return false
		}
		folded = folded || strings.EqualFold(name, n)
	}
	return folded
}

// exactMembers returns body without its top-level members whose names
// match an apiRequest name only with case folded (body itself when it has
// none, or is not an object: decoding it reports that).
func exactMembers(body []byte) []byte {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return body
	}
	dropped := false
	for name := range members {
		if foldedOnly(name) {
			delete(members, name)
			dropped = true
		}
	}
	if !dropped {
		return body
	}
	out, err := json.Marshal(members)
	if err != nil {
		return body
	}
	return out
}
