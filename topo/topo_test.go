package topo

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testkit"
)

func TestPaths(t *testing.T) {
	p, err := NewPaths("", "prod-eu")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		p.Cluster():               "/shardvisor/prod-eu",
		p.Map():                   "/shardvisor/prod-eu/map",
		p.PoolConfig("web"):       "/shardvisor/prod-eu/pools/web/config",
		p.PoolStatus("web"):       "/shardvisor/prod-eu/pools/web/status",
		p.PoolMember("web", "h1"): "/shardvisor/prod-eu/pools/web/members/h1",
		p.Router("r1"):            "/shardvisor/prod-eu/routers/r1",
		p.Move("m-1"):             "/shardvisor/prod-eu/moves/m-1",
		p.Lock("gc"):              "/shardvisor/prod-eu/locks/gc",
	}
	for got, w := range want {
		if got != w {
			t.Errorf("path %q, want %q", got, w)
		}
	}
	if q := MustPaths("/t/x", "c"); q.Map() != "/t/x/c/map" {
		t.Errorf("custom root: %s", q.Map())
	}
	for _, bad := range [][2]string{{"", ""}, {"", "Prod"}, {"", "a/b"}, {"", "-a"}, {"rel", "a"}, {"/a/", "a"}, {"/a/../b", "a"}, {"", strings.Repeat("a", 64)}} {
		if _, err := NewPaths(bad[0], bad[1]); err == nil {
			t.Errorf("NewPaths(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

func TestDecodeStrict(t *testing.T) {
	good := []byte(`{"version":1,"name":"c1","seed":"00ff","created_at":"2026-01-02T03:04:05Z"}`)
	r, err := DecodeCluster("/x", good)
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "c1" || r.Seed != "00ff" || !r.CreatedAt.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Fatalf("decoded %+v", r)
	}
	testkit.WantMalformed(t, ErrMalformed, "DecodeCluster", DecodeCluster, "cluster record", "/shardvisor/c1", []testkit.Malformed{
		{"", "empty"},
		{"[1]", "not a JSON object"},
		{`{"name":"c1"}`, `no "version"`},
		{`{"version":3,"name":"c1","seed":"00"}`, "format version 3 is not supported"},
		{`{"version":1,"name":"c1","seed":"00","tables":[{"name":"public.t","key_column":"k"}]}`, "needs format version 2"},
		{`{"version":2,"name":"c1","seed":"00","tables":[{"name":"t","key_column":"k"}]}`, "must be schema-qualified"},
		{`{"version":2,"name":"c1","seed":"00","tables":[{"name":"public.T","key_column":"k"}]}`, "lower-case SQL identifier"},
		{`{"version":2,"name":"c1","seed":"00","tables":[{"name":"public.t","key_column":"k-1"}]}`, "key column"},
		{`{"version":2,"name":"c1","seed":"00","tables":[{"name":"public.t","key_column":"k"},{"name":"public.t","key_column":"j"}]}`, "listed twice"},
		{`{"version":2,"name":"c1","seed":"00","tables":[{"name":"public.t","key_column":"k","x":1}]}`, `unknown field "x"`},
		{`{"version":0,"name":"c1","seed":"00"}`, "format version 0"},
		{`{"version":1,"name":"c1","seed":"00","extra":1}`, `unknown field "extra"`},
		{`{"version":1,"name":"c1","seed":"00"} {}`, "trailing data"},
		{`{"version":1,"name":"C1","seed":"00"}`, "cluster name"},
		{`{"version":1,"name":"c1","seed":"zz"}`, "not hex"},
		{`{"version":1,"name":"c1","seed":""}`, "not hex"},
	})
}

func TestEncodeRoundTrip(t *testing.T) {
	in := ClusterRecord{Version: ClusterVersion, Name: "c", Seed: "abcd", CreatedAt: time.Unix(1700000000, 0).UTC(),
		Tables: []TableRecord{{Name: "public.events", KeyColumn: "bucket_key"}}}
	b, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeCluster("", b)
	if err != nil || !reflect.DeepEqual(*out, in) {
		t.Fatalf("round trip: %+v, %v", out, err)
	}
}
