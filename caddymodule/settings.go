package caddymodule

import (
	"reflect"
	"strings"
	"unicode"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// settingNames maps the selection.Config fields whose kv_router option has
// another name; the others are the field name in snake_case.
var settingNames = map[string]string{
	"DefaultBlockSize":       "block_size",
	"SessionAffinitySoft":    "session_affinity_mode",
	"MaxReservationsPerRank": "max_reservations_per_worker",
	// Set from kv_events_bind (its change is named there too): the log
	// used to name an option that does not exist.
	"KVEventsBound": "kv_events_bind",
}

// changedSettings lists, by kv_router option name, the settings that
// differ between old and cur: the router's (selection.Config) or the
// ones the KV index and listeners were built with (eventSettings).
func changedSettings[T selection.Config | eventSettings](old, cur T) []string {
	var out []string
	ov, cv := reflect.ValueOf(old), reflect.ValueOf(cur)
	t := ov.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() || f.Type.Kind() == reflect.Func {
			continue
		}
		if reflect.DeepEqual(ov.Field(i).Interface(), cv.Field(i).Interface()) {
			continue
		}
		out = append(out, optionName(f.Name))
	}
	return out
}

// optionName is the kv_router option of a settings field.
func optionName(field string) string {
	if name, ok := settingNames[field]; ok {
		return name
	}
	return snakeCase(field)
}

// optionNames maps optionName over fields.
func optionNames(fields []string) []string {
	out := make([]string, len(fields))
	for i, f := range fields {
		out[i] = optionName(f)
	}
	return out
}

// snakeCase turns a Go field name into its snake_case form, keeping
// initialisms together: ApproxTTL → approx_ttl, UseKVEvents → use_kv_events.
func snakeCase(name string) string {
	rs := []rune(name)
	var b strings.Builder
	for i, r := range rs {
		if unicode.IsUpper(r) && i > 0 {
			prevLower := unicode.IsLower(rs[i-1])
			nextLower := i+1 < len(rs) && unicode.IsLower(rs[i+1])
			if prevLower || (unicode.IsUpper(rs[i-1]) && nextLower) {
				b.WriteByte('_')
			}
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}
