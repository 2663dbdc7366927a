package selection

import (
	"bytes"
	"reflect"
	"strings"
	"sync"
)

// Exact member names. goccy/go-json, like encoding/json, takes a member
// whose name differs from a field's only in case ("MODEL" for "model"),
// and DecodeJSON's own token_ids reader did too. The selection API keeps
// that (docs/selection-api.md). A body the gateway forwards to an engine
// must be read as the engine reads it: vLLM's OpenAI routes (pydantic)
// take a member under its exact name only and ignore other names as
// extras. Read case-insensitively, {"model": "a", "MODEL": "b"} was routed
// as model b and served as model a, and a "TOOLS" member went into the
// gateway's tokenization and not the engine's.

// ExactNames is implemented by request types whose members match by exact
// name: DecodeJSON leaves out any top-level member whose name is not one of
// the type's JSON names but equals one with case folded.
type ExactNames interface{ ExactNames() }

// memberNames is a request type's JSON names, as a set and as a list (to
// compare a name with case folded without allocating).
type memberNames struct {
	set  map[string]bool
	list [][]byte
}

var namesByType sync.Map // reflect.Type → *memberNames

// namesOf returns the JSON names of the struct v points to, embedded
// structs' included; token_ids, which DecodeJSON reads itself, is one.
func namesOf(v any) *memberNames {
	t := reflect.TypeOf(v)
	if m, ok := namesByType.Load(t); ok {
		return m.(*memberNames)
	}
	m := &memberNames{set: map[string]bool{"token_ids": true}}
	collectNames(t.Elem(), m.set)
	for n := range m.set {
		m.list = append(m.list, []byte(n))
	}
	namesByType.Store(t, m)
	return m
}

func collectNames(t reflect.Type, names map[string]bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				collectNames(ft, names)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		names[name] = true
	}
}

// foldedOnly reports whether key is none of the names but equals one with
// case folded: a member the generic decoder would take and the engine
// ignores.
func (m *memberNames) foldedOnly(key []byte) bool {
	if m.set[string(key)] {
		return false
	}
	for _, n := range m.list {
		if bytes.EqualFold(key, n) {
			return true
		}
	}
	return false
}
