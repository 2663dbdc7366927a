package caddymodule

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestDiscoveryCaddyfile: the discover subdirective of the kv_router
// global option, its JSON (at the app's top level, read back the same),
// and the mistakes refused with their line.
func TestDiscoveryCaddyfile(t *testing.T) {
	for i, tc := range []struct {
		input   string
		want    []DNSDiscovery
		json    string
		wantErr string
	}{
		{
			input: "kv_router {\n discover dns vllm.llm.svc.cluster.local\n}",
			want:  []DNSDiscovery{{DNS: "vllm.llm.svc.cluster.local"}},
			json:  `"discover":[{"dns":"vllm.llm.svc.cluster.local"}]`,
		},
		{
			input: `kv_router {
				discover dns vllm.llm.svc.cluster.local {
					type a
					http_port 8080
					kv_events_port 6000
					replay_port off
					refresh 30s
					resolver 10.96.0.10
					model_name llama
					routing_group prod
					block_size 16
					dp_size 2
					max_workers 64
				}
				discover dns _http._tcp.sglang.llm.svc.cluster.local. {
					kv_events_srv kv-events
					replay_srv kv-replay
					resolver 127.0.0.1:5353
				}
			}`,
			want: []DNSDiscovery{
				{DNS: "vllm.llm.svc.cluster.local", Type: "a", HTTPPort: 8080, KVEventsPort: new(6000), ReplayPort: new(0),
					Refresh: caddy.Duration(30 * time.Second), Resolver: "10.96.0.10", ModelName: "llama", RoutingGroup: "prod",
					BlockSize: 16, DataParallelSize: 2, MaxWorkers: 64},
				{DNS: "_http._tcp.sglang.llm.svc.cluster.local.", KVEventsSRV: "kv-events", ReplaySRV: "kv-replay", Resolver: "127.0.0.1:5353"},
			},
			json: `"discover":[{"dns":"vllm.llm.svc.cluster.local","type":"a","http_port":8080,"kv_events_port":6000,"replay_port":0,` +
				`"refresh":30000000000,"resolver":"10.96.0.10","model_name":"llama","routing_group":"prod","block_size":16,` +
				`"data_parallel_size":2,"max_workers":64},` +
				`{"dns":"_http._tcp.sglang.llm.svc.cluster.local.","kv_events_srv":"kv-events","replay_srv":"kv-replay","resolver":"127.0.0.1:5353"}]`,
		},
		{input: "kv_router {\n discover\n}", wantErr: "wrong argument count"},
		{input: "kv_router {\n discover dns\n}", wantErr: "wrong argument count"},
		{input: "kv_router {\n discover dns a b\n}", wantErr: "wrong argument count"},
		{input: "kv_router {\n discover consul vllm\n}", wantErr: "the source must be dns"},
		{input: "kv_router {\n discover dns vllm {\n weight 3\n }\n}", wantErr: "unrecognized discover subdirective weight"},
		{input: "kv_router {\n discover dns vllm {\n http_port 0\n }\n}", wantErr: "http_port must be a port between 1 and 65535"},
		{input: "kv_router {\n discover dns vllm {\n http_port off\n }\n}", wantErr: "http_port must be a port"},
		{input: "kv_router {\n discover dns vllm {\n kv_events_port 70000\n }\n}", wantErr: "kv_events_port must be a port between 1 and 65535 or off"},
		{input: "kv_router {\n discover dns vllm {\n refresh 100ms\n }\n}", wantErr: "discover dns vllm: refresh must be at least 1s, not 100ms, at Testfile:4"},
		{input: "kv_router {\n discover dns vllm {\n type mx\n }\n}", wantErr: "type must be a, aaaa or srv"},
		{input: "kv_router {\n discover dns vllm\n discover dns VLLM.\n}", wantErr: "the name is given twice"},
		{input: "kv_router {\n discover dns _http._tcp.vllm {\n http_port 8000\n }\n}", wantErr: "an SRV record carries the HTTP port"},
		{input: "kv_router {\n discover dns vllm {\n kv_events_srv kv-events\n }\n}", wantErr: "only an SRV name has sibling port names"},
		{input: "kv_router {\n discover dns _http._tcp.vllm {\n kv_events_srv kv-events\n kv_events_port 5557\n }\n}",
			wantErr: "two sources for one port"},
		{input: "kv_router {\n discover dns _http._tcp.vllm {\n replay_srv kv_replay\n }\n}", wantErr: "is not a port name"},
		{input: "kv_router {\n discover dns vllm {\n dp_size 2\n replay_port 5657\n }\n}", wantErr: "takes no replay endpoint"},
		{input: "kv_router {\n discover dns vllm {\n dp_size 4\n kv_events_port 65534\n }\n}", wantErr: "past port 65535"},
		{input: "kv_router {\n discover dns vllm {\n max_workers 100000\n }\n}", wantErr: "max_workers must be between 1 and 65536"},
		{input: "kv_router {\n discover dns vllm {\n resolver 10.0.0.1:dns\n }\n}", wantErr: "is not host:port"},
		{input: "kv_router {\n discover dns vllm..svc\n}", wantErr: "is not a DNS name"},
	} {
		var got App
		err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if !parsedAsWanted(t, i, err, tc.wantErr) {
			continue
		}
		if !reflect.DeepEqual(got.Discover, tc.want) {
			t.Errorf("Test %d: got %+v, want %+v", i, got.Discover, tc.want)
		}
		b, err := json.Marshal(&got)
		if err != nil || !strings.Contains(string(b), tc.json) {
			t.Errorf("Test %d: JSON %s, want it to hold %s (%v)", i, b, tc.json, err)
		}
		var back App
		if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back.Discover, got.Discover) {
			t.Errorf("Test %d: read back from its JSON as %+v (%v)", i, back.Discover, err)
		}
	}
}

// TestDiscoverySettings: the defaults an entry gets, the type inferred
// from the name, and the sibling SRV names.
func TestDiscoverySettings(t *testing.T) {
	s, err := (&DNSDiscovery{DNS: "VLLM.llm.svc.cluster.local."}).settings()
	want := dnsSettings{name: "VLLM.llm.svc.cluster.local.", key: "vllm.llm.svc.cluster.local", recordType: recordA,
		httpPort: 8000, eventsPort: 5557, replayPort: 5657, refresh: 10 * time.Second, dpSize: 1, maxWorkers: 256}
	if err != nil || s != want {
		t.Errorf("A defaults: %+v, %v", s, err)
	}
	s, err = (&DNSDiscovery{DNS: "_http._tcp.vllm", KVEventsSRV: "_kv-events", DataParallelSize: 2, Resolver: "::1"}).settings()
	want = dnsSettings{name: "_http._tcp.vllm", key: "_http._tcp.vllm", recordType: recordSRV, eventsSRV: "_kv-events._tcp.vllm",
		refresh: 10 * time.Second, resolver: "[::1]:53", dpSize: 2, maxWorkers: 256}
	if err != nil || s != want {
		t.Errorf("SRV with a sibling and two ranks: %+v, %v", s, err)
	}
	for in, want := range map[string]string{"::1": "[::1]:53", "[::1]": "[::1]:53", "[::1]:5353": "[::1]:5353", "10.0.0.10": "10.0.0.10:53",
		"dns.local": "dns.local:53", "[dns.local]": "", "[::1": "", "::1:": ""} {
		got, err := resolverAddress(in)
		if got != want || (err != nil) != (want == "") {
			t.Errorf("resolver %q: %q, %v; want %q", in, got, err, want)
		}
	}
	if s, err := (&DNSDiscovery{DNS: "_http._tcp.vllm", Type: "a", KVEventsPort: new(0)}).settings(); err != nil ||
		s.recordType != recordA || s.eventsPort != 0 || s.httpPort != 8000 {
		t.Errorf("type a given for a name with an underscore, events off: %+v, %v", s, err)
	}
}
