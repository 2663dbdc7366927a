package selection

import (
	"fmt"

	json "github.com/goccy/go-json"
)

// Bounded request members. A selection request's lists and maps are
// decoded by goccy, which allocates as it goes: a body of 8 MiB held 3.75M
// allowed_worker_ids (+106 MB while the request lasted), 2.8M empty
// block_mm_infos (+82 MB), or as many taints (+50 MB). These members now
// count their values first, in one pass over their bytes, and refuse past
// a bound before anything is decoded (docs/selection-api.md, "Bounds").

// Bounds of the request members below.
const (
	// maxAllowedWorkerIDs is the catalog's default worker bound
	// (MaxWorkers): a list of more ids than workers allows nothing more.
	maxAllowedWorkerIDs = 65_536
	// maxRequiredTaints is MaxTaints: a worker holds no more, so a request
	// that requires more matches none.
	maxRequiredTaints = MaxTaints
	// maxPreferredTaints bounds the taints a request weighs, over all the
	// workers it may prefer.
	maxPreferredTaints = 1024
	// maxMMValues bounds a block_mm_infos member's JSON values at every
	// depth (blocks, their objects and their offsets): a 2M-token prompt's
	// blocks at block size 16, each with an object and its offsets.
	maxMMValues = 1 << 19
)

// jsonValues counts b's JSON values after the first, as separators and
// opened containers, outside strings; it stops counting past max. b is a
// whole value that goccy has already delimited.
func jsonValues(b []byte, max int) (n int) {
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case ',', '[', '{':
			if n++; n > max {
				return n
			}
		}
	}
	return n
}

// decodeBounded decodes b into v (a pointer to a slice or map) unless b
// holds more than max values, which is a 422 naming field.
func decodeBounded(b []byte, v any, max int, field string) error {
	if jsonValues(b, max) > max {
		return &fieldError{msg: fmt.Sprintf("%s: more than %d entries", field, max)}
	}
	return json.Unmarshal(b, v)
}

// WorkerIDs is allowed_worker_ids, at most maxAllowedWorkerIDs of them.
type WorkerIDs []uint64

// UnmarshalJSON implements json.Unmarshaler.
func (l *WorkerIDs) UnmarshalJSON(b []byte) error {
	return decodeBounded(b, (*[]uint64)(l), maxAllowedWorkerIDs, "allowed_worker_ids")
}

// RequiredTaints is routing_constraints.required_taints, at most
// maxRequiredTaints of them.
type RequiredTaints []string

// UnmarshalJSON implements json.Unmarshaler.
func (l *RequiredTaints) UnmarshalJSON(b []byte) error {
	return decodeBounded(b, (*[]string)(l), maxRequiredTaints, "required_taints")
}

// PreferredTaints is routing_constraints.preferred_taints, at most
// maxPreferredTaints of them.
type PreferredTaints map[string]float32

// UnmarshalJSON implements json.Unmarshaler.
func (m *PreferredTaints) UnmarshalJSON(b []byte) error {
	return decodeBounded(b, (*map[string]float32)(m), maxPreferredTaints, "preferred_taints")
}

// BlockMMInfos is a prompt's block_mm_infos, of at most maxMMValues JSON
// values in all.
type BlockMMInfos []*BlockMMInfo

// UnmarshalJSON implements json.Unmarshaler.
func (l *BlockMMInfos) UnmarshalJSON(b []byte) error {
	return decodeBounded(b, (*[]*BlockMMInfo)(l), maxMMValues, "block_mm_infos")
}
