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

// TestClusterCaddyfile: the cluster subdirective, its JSON at the app's
// top level, and the mistakes refused.
func TestClusterCaddyfile(t *testing.T) {
	for i, tc := range []struct {
		input   string
		want    *ClusterSettings
		wantErr string
	}{
		{
			input: "kv_router {\n cluster nats://127.0.0.1:4222 {\n name gw-a\n }\n}",
			want:  &ClusterSettings{URLs: []string{"nats://127.0.0.1:4222"}, Name: "gw-a"},
		},
		{
			input: `kv_router {
				cluster nats://n0:4222 tls://n1:4222 {
					name gw_b
					prefix edge.kv
					credentials /etc/r.creds
					tls_ca /etc/ca.pem
					tls_cert /etc/c.pem
					tls_key /etc/k.pem
					heartbeat 500ms
					lease 2s
					max_remote_bookings 1000
					max_message_bytes 64KiB
					max_hashes 2048
					queue_length 512
					max_catalog_value_bytes 8KiB
				}
			}`,
			want: &ClusterSettings{URLs: []string{"nats://n0:4222", "tls://n1:4222"}, Name: "gw_b", Prefix: "edge.kv",
				Credentials: "/etc/r.creds", TLSCA: "/etc/ca.pem", TLSCert: "/etc/c.pem", TLSKey: "/etc/k.pem",
				Heartbeat: caddy.Duration(500 * time.Millisecond), Lease: caddy.Duration(2 * time.Second),
				MaxRemoteBookings: 1000, MaxMessageBytes: 64 << 10, MaxHashes: 2048, QueueLength: 512, MaxCatalogValueBytes: 8 << 10},
		},
		{input: "kv_router {\n cluster\n}", wantErr: "wrong argument count"},
		{input: "kv_router {\n cluster 127.0.0.1:4222 {\n name a\n }\n}", wantErr: "is not a URL"},
		{input: "kv_router {\n cluster nats://h:1 {\n name a.b\n }\n}", wantErr: "may hold only"},
		{input: "kv_router {\n cluster nats://h:1 {\n name a\n heartbeat 1s\n lease 1s\n }\n}", wantErr: "at least twice"},
		{input: "kv_router {\n cluster nats://h:1 {\n name a\n tls_cert c.pem\n }\n}", wantErr: "go together"},
		{input: "kv_router {\n cluster nats://h:1 {\n name a\n bogus 1\n }\n}", wantErr: "unrecognized cluster subdirective"},
		{input: "kv_router {\n cluster nats://h:1\n cluster nats://h:2\n}", wantErr: "given once"},
		{input: "kv_router {\n cluster nats://h:1 {\n name a\n max_hashes 100000\n }\n}", wantErr: "cannot carry"},
		{input: "kv_router {\n cluster nats://h:1 {\n name a\n max_catalog_value_bytes 100\n }\n}", wantErr: "at least 1024"},
	} {
		var app App
		err := app.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("case %d: want error containing %q, got %v", i, tc.wantErr, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if !reflect.DeepEqual(app.Cluster, tc.want) {
			t.Fatalf("case %d: got %+v, want %+v", i, app.Cluster, tc.want)
		}
		data, _ := json.Marshal(&app)
		var back App
		if err := json.Unmarshal(data, &back); err != nil || !reflect.DeepEqual(back.Cluster, tc.want) {
			t.Fatalf("case %d: JSON %s read back as %+v (%v)", i, data, back.Cluster, err)
		}
	}
}

// TestSettingsFingerprint: replicas with the same routing settings share
// a fingerprint whatever their workers and cluster names; another
// scoring setting changes it.
func TestSettingsFingerprint(t *testing.T) {
	scale := 4.0
	a := App{BlockSize: 16, PrefillLoadScale: &scale, Workers: []WorkerConfig{{}},
		ClusterConfig: ClusterConfig{Cluster: &ClusterSettings{URLs: []string{"nats://h:1"}, Name: "a"}}}
	b := App{BlockSize: 16, PrefillLoadScale: &scale,
		ClusterConfig: ClusterConfig{Cluster: &ClusterSettings{URLs: []string{"nats://h:1"}, Name: "b"}}}
	if a.settingsFingerprint() != b.settingsFingerprint() {
		t.Fatal("replicas that differ only in workers and name have different fingerprints")
	}
	other := 2.0
	b.PrefillLoadScale = &other
	if a.settingsFingerprint() == b.settingsFingerprint() {
		t.Fatal("another prefill_load_scale has the same fingerprint")
	}
}
