package caddymodule

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docsExample is one fenced Caddyfile block of the README or docs/.
type docsExample struct {
	file string
	line int
	// fragment is true for a caddy-d block: directives without their
	// site block around them.
	fragment bool
	body     string
}

// docsExamples reads the fenced blocks tagged caddy, caddyfile or caddy-d
// from README.md and docs/*.md.
func docsExamples(t *testing.T) []docsExample {
	t.Helper()
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../README.md")
	var out []docsExample
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var open *docsExample
		for i, line := range strings.Split(string(raw), "\n") {
			switch {
			case open != nil && strings.HasPrefix(line, "```"):
				out = append(out, *open)
				open = nil
			case open != nil:
				open.body += line + "\n"
			case strings.HasPrefix(line, "```"):
				switch strings.TrimPrefix(line, "```") {
				case "caddy", "caddyfile":
					open = &docsExample{file: file, line: i + 1}
				case "caddy-d":
					open = &docsExample{file: file, line: i + 1, fragment: true}
				}
			}
		}
	}
	return out
}

// grammarValues stands a sample value in for each placeholder the docs'
// grammar blocks use, so that the grammar itself goes through the
// parser: a keyword the docs list and the parser does not know fails.
var grammarValues = []struct{ placeholder, value string }{
	{"heartbeat <duration>", "heartbeat 1s"}, // the lease must be twice as long
	{" [<matcher>]", ""},
	{" [off]", ""},
	{"<policy> [<args...>]", "round_robin"},
	{"<nats url>...", "nats://127.0.0.1:4222"},
	{"<class...>", "high low"},
	{"<class>", "low"},
	{"<zmq endpoint>", "tcp://127.0.0.1:5557"},
	{"<host:port>", "127.0.0.1:8000"},
	{"<host[:port]>", "127.0.0.1:53"},
	{"<port>|off", "off"},
	{"<port name>", "kv-events"},
	{"<port>", "8000"},
	{"<id>", "1"},
	{"<name>", "m"},
	{"<tokens>", "16"},
	{"<rank>", "2"},
	{"<ranks>", "1"},
	{"<blocks>", "1000"},
	{"<count>", "8"},
	{"<entries>", "100000"},
	{"<float>", "0.5"},
	{"<duration>", "5s"},
	{"<size>", "16MiB"},
	{"<header>", "X-Example"},
	{"<secret>", "example-token"},
	{"<file>", "/etc/kvrouter/example.pem"},
	{"on|off", "on"},
	{"hard|soft", "hard"},
	{"worker_host|any", "any"},
	{"a|aaaa|srv", "a"},
}

var (
	// globalOnly finds what only the kv_router global option holds.
	globalOnly   = regexp.MustCompile(`(?m)^\t(worker|discover|cluster) `)
	placeholder  = regexp.MustCompile(`<[a-z][a-z .:\[\]]*>`)
	grammarElide = regexp.MustCompile(`(?m)^\s*\.\.\..*\n`)
	// grammar blocks align their values in columns; caddy fmt would not.
	grammarColumns = regexp.MustCompile(`([^\s])  +`)
	grammarSRV     = regexp.MustCompile(`(?m)^\s*[a-z_]+_srv\s.*\n`)
)

// instantiate turns a grammar block into a Caddyfile the parser can read:
// placeholders get sample values, and "... (see elsewhere)" lines go, as
// do the SRV port names, which stand instead of the port numbers beside
// them (the SRV example in discovery.md sets them).
func instantiate(body string) string {
	body = grammarElide.ReplaceAllString(body, "")
	body = grammarSRV.ReplaceAllString(body, "")
	body = grammarColumns.ReplaceAllString(body, "$1 ")
	for _, v := range grammarValues {
		body = strings.ReplaceAll(body, v.placeholder, v.value)
	}
	return body
}

// wrap puts a caddy-d fragment where it belongs: the reverse proxy's
// subdirectives inside a reverse_proxy, a global kv_router block (the
// one with workers, discovery or a cluster) among the global options,
// anything else inside a site.
func wrap(body string) string {
	first := strings.Fields(body)[0]
	switch {
	case first == "lb_policy" || first == "dynamic":
		return ":8080 {\n\treverse_proxy {\n" + indent(body, "\t\t") + "\t}\n}\n"
	case first == "kv_router" && globalOnly.MatchString(body):
		return "{\n" + indent(body, "\t") + "}\n"
	default:
		return ":8080 {\n" + indent(body, "\t") + "}\n"
	}
}

// indent puts prefix before each line but a blank one, as caddy fmt
// would.
func indent(body, prefix string) string {
	lines := strings.SplitAfter(strings.TrimRight(body, "\n"), "\n")
	for i, l := range lines {
		if l != "\n" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "") + "\n"
}

// TestDocsCaddyfileExamplesAdapt: every Caddyfile example in the README
// and docs/, and every grammar block once its placeholders are filled,
// goes through Caddy's adapter with no error and no warning (a copied
// example must not warn that it is unformatted), and its kv_router app
// decodes without unknown fields and validates. Together the docs'
// examples must set every field of each of the modules' configs, so an
// option the parser gains is documented with it.
func TestDocsCaddyfileExamplesAdapt(t *testing.T) {
	t.Setenv("KVROUTER_WRITE_TOKEN", "example-token")
	examples := docsExamples(t)
	if len(examples) < 20 {
		t.Fatalf("found %d Caddyfile examples in the docs; the reader is broken", len(examples))
	}
	set := configFieldsSet{}
	for _, ex := range examples {
		name := filepath.Base(ex.file) + ":" + strconv.Itoa(ex.line)
		body := ex.body
		if placeholder.MatchString(body) {
			body = instantiate(body)
			if left := placeholder.FindString(body); left != "" {
				t.Errorf("%s: no sample value for %s", name, left)
				continue
			}
		}
		if ex.fragment {
			body = wrap(body)
		}
		t.Run(name, func(t *testing.T) {
			cfg := adapt(t, name, []byte(body))
			set.collect(cfg)
			apps, _ := cfg["apps"].(map[string]any)
			app, ok := apps["kv_router"].(map[string]any)
			if !ok {
				return
			}
			raw, _ := json.Marshal(app)
			var a App
			dec := json.NewDecoder(strings.NewReader(string(raw)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&a); err != nil {
				t.Fatalf("%s: %v", raw, err)
			}
			if err := a.Validate(); err != nil {
				t.Errorf("the example's kv_router app does not validate: %v", err)
			}
		})
	}
	for _, c := range []struct {
		what   string
		config any
	}{
		{"app", App{}},
		{"worker", WorkerConfig{}},
		{"cluster", ClusterSettings{}},
		{"discover", DNSDiscovery{}},
		{"handler", Handler{}},
		{"overload", OverloadConfig{}},
		{"policy", Policy{}},
		{"selection", SelectionHandler{}},
	} {
		if len(set[c.what]) == 0 {
			t.Errorf("no docs example configures the %s at all", c.what)
			continue
		}
		for _, f := range jsonFields(reflect.TypeOf(c.config)) {
			if !set[c.what][f] {
				t.Errorf("no docs example sets the %s's %q", c.what, f)
			}
		}
	}
}

// configFieldsSet holds, for each of the modules' config objects, the
// JSON fields some adapted example set.
type configFieldsSet map[string]map[string]bool

func (s configFieldsSet) add(what string, obj map[string]any) {
	if s[what] == nil {
		s[what] = map[string]bool{}
	}
	for k := range obj {
		s[what][k] = true
	}
}

// collect records the fields an adapted config sets in each of the
// modules' config objects: the app and what it holds, and the handlers
// and policy wherever the http app put them.
func (s configFieldsSet) collect(cfg map[string]any) {
	apps, _ := cfg["apps"].(map[string]any)
	if app, ok := apps["kv_router"].(map[string]any); ok {
		s.add("app", app)
		for _, w := range asObjects(app["workers"]) {
			s.add("worker", w)
		}
		for _, d := range asObjects(app["discover"]) {
			s.add("discover", d)
		}
		if c, ok := app["cluster"].(map[string]any); ok {
			s.add("cluster", c)
		}
	}
	s.walk(apps["http"])
}

// walk finds the handlers and the policy in the http app's tree.
func (s configFieldsSet) walk(node any) {
	switch v := node.(type) {
	case []any:
		for _, e := range v {
			s.walk(e)
		}
	case map[string]any:
		switch {
		case v["handler"] == "kv_router":
			s.add("handler", v)
			if o, ok := v["overload"].(map[string]any); ok {
				s.add("overload", o)
			}
		case v["handler"] == "kv_selection":
			s.add("selection", v)
		case v["policy"] == "kv_router":
			s.add("policy", v)
		}
		for _, e := range v {
			s.walk(e)
		}
	}
}

// asObjects reads a JSON array of objects.
func asObjects(v any) []map[string]any {
	var out []map[string]any
	list, _ := v.([]any)
	for _, e := range list {
		if obj, ok := e.(map[string]any); ok {
			out = append(out, obj)
		}
	}
	return out
}

// jsonFields lists the JSON names of a struct's fields, those of the
// structs it embeds included.
func jsonFields(typ reflect.Type) []string {
	var names []string
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case f.Anonymous && name == "":
			names = append(names, jsonFields(f.Type)...)
		case name != "" && name != "-":
			names = append(names, name)
		}
	}
	return names
}
