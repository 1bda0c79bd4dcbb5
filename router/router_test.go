package router

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/keystream"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func fileRouter(t testing.TB, m *bucketmap.Map) *Router {
	t.Helper()
	r, err := NewFromFile(clustertest.WriteMapFile(t, t.TempDir(), m), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func TestRouteMatchesKeystreamAndMap(t *testing.T) {
	m, err := bucketmap.New(6, clustertest.Nodes(3), t0)
	if err != nil {
		t.Fatal(err)
	}
	m = clustertest.Next(m)
	if err := m.SetMoving(bucketmap.Bucket{Prefix: 5, Depth: m.Level}, "pg3", "mv-5"); err != nil {
		t.Fatal(err)
	}
	r := fileRouter(t, m)
	seed, _ := keystream.ParseSeed(clustertest.Seed)
	ks, _ := keystream.New(seed)
	sawMoving := false
	for i := range 2000 {
		uid := fmt.Sprintf("user-%d", i)
		rt, err := r.Route(uid)
		if err != nil {
			t.Fatal(err)
		}
		b := ks.Bucket(uid, 6)
		if rt.Bucket != b || rt.Node != m.Owner(b) || rt.Level != 6 || rt.MapVersion != 2 || rt.Stale || rt.Suspended {
			t.Fatalf("%s: %+v, want bucket %d on %s", uid, rt, b, m.Owner(b))
		}
		n, _ := m.Node(rt.Node)
		if rt.DSN != n.DSN {
			t.Fatalf("dsn %q", rt.DSN)
		}
		if b == 5 {
			sawMoving = true
			if rt.State != bucketmap.BucketMoving || rt.Target != "pg3" {
				t.Fatalf("moving bucket answered %+v", rt)
			}
		} else if rt.State != bucketmap.BucketActive {
			t.Fatalf("%+v", rt)
		}
	}
	if !sawMoving {
		t.Fatal("no user landed in bucket 5")
	}
	// Level 0: every user in bucket 0.
	m0, _ := bucketmap.New(0, clustertest.Nodes(1), t0)
	if rt, _ := fileRouter(t, m0).Route("anyone"); rt.Bucket != 0 || rt.Node != "pg1" {
		t.Fatalf("level 0: %+v", rt)
	}
}

func TestRouteAtStaleMapProtocol(t *testing.T) {
	m1, _ := bucketmap.New(2, clustertest.Nodes(2), t0) // pg1: 0,1  pg2: 2,3
	m2 := clustertest.Next(m1)
	if err := m2.Assign(bucketmap.Bucket{Prefix: 0, Depth: m2.Level}, "pg2", bucketmap.AssignOptions{}); err != nil {
		t.Fatal(err)
	}
	m3 := clustertest.Next(m2)
	if err := m3.Assign(bucketmap.Bucket{Prefix: 1, Depth: m3.Level}, "pg2", bucketmap.AssignOptions{}); err != nil {
		t.Fatal(err)
	}
	// The router only ever saw version 3: answers for 1 and 2 come from the
	// map's history.
	r := fileRouter(t, m3)
	var inB0, inB1, inB2 string
	for i := 0; inB0 == "" || inB1 == "" || inB2 == ""; i++ {
		uid := fmt.Sprint("u", i)
		rt, _ := r.Route(uid)
		switch rt.Bucket {
		case 0:
			inB0 = uid
		case 1:
			inB1 = uid
		case 2:
			inB2 = uid
		}
	}
	for _, tc := range []struct {
		uid   string
		used  uint64
		moved bool
		from  bucketmap.NodeID
	}{
		{inB0, 1, true, "pg1"}, // moved at version 2
		{inB0, 2, false, ""},   // already on pg2 at version 2
		{inB1, 1, true, "pg1"}, // moved at version 3
		{inB1, 2, true, "pg1"}, // still on pg1 at version 2
		{inB2, 1, false, ""},   // never moved
		{inB0, 0, false, ""},   // version unknown: plain answer
		{inB0, 99, false, ""},  // a newer version than ours: nothing to say
	} {
		rt, err := r.RouteAt(tc.uid, tc.used)
		if err != nil || rt.Moved != tc.moved || rt.MovedFrom != tc.from || rt.Node != "pg2" && tc.moved {
			t.Errorf("RouteAt(bucket %d, used v%d) = %+v, want moved=%v from %q", rt.Bucket, tc.used, rt, tc.moved, tc.from)
		}
	}
}

func TestNewFromFileRejectsBadFiles(t *testing.T) {
	dir := t.TempDir()
	m, _ := bucketmap.New(2, clustertest.Nodes(2), t0)
	good := clustertest.WriteMapFile(t, dir, m)
	data, _ := os.ReadFile(good)
	for name, tc := range map[string]struct{ data, errHas string }{
		"missing":   {"", "no such file"},
		"not json":  {"nope", "map file"},
		"bad seed":  {strings.Replace(string(data), clustertest.Seed, "00", 1), "at least 16"},
		"bad map":   {regexp.MustCompile(`"level":\s*2`).ReplaceAllString(string(data), `"level": 3`), "owners"},
		"extra key": {strings.Replace(string(data), `"cluster"`, `"extra": 1, "cluster"`, 1), `unknown field "extra"`},
	} {
		p := filepath.Join(dir, name)
		if name != "missing" {
			os.WriteFile(p, []byte(tc.data), 0o644)
		}
		if _, err := NewFromFile(p, Options{}); err == nil || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("%s: %v, want %q", name, err, tc.errHas)
		}
	}
}

// BenchmarkRouteVsPrefix64 measures Route at 2^16 buckets against
// keystream.Prefix64 alone, in one run, and reports the ratio.
// BenchmarkRouteVsPrefix64 compares Route with the keystream hash alone
// on 2^16 buckets over 100 nodes: at one depth (level 16), and at mixed
// depths (one bucket at depth 15, one at 17, the rest at 16).
func BenchmarkRouteVsPrefix64(b *testing.B) {
	b.Run("one-depth", func(b *testing.B) {
		m, err := bucketmap.New(16, clustertest.Nodes(100), t0)
		if err != nil {
			b.Fatal(err)
		}
		benchRoute(b, m)
	})
	b.Run("mixed-depths", func(b *testing.B) { benchRoute(b, mixedMap(b)) })
}

// mixedMap is 2^16 buckets at depths 15..17 over 100 nodes.
func mixedMap(t testing.TB) *bucketmap.Map {
	m, err := bucketmap.New(15, clustertest.Nodes(100), t0)
	if err != nil {
		t.Fatal(err)
	}
	m = clustertest.Next(m)
	for p := uint32(1); p < 1<<15; p++ {
		if err := m.SplitBucket(bucketmap.Bucket{Prefix: p, Depth: 15}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.SplitBucket(bucketmap.Bucket{Prefix: 1<<16 - 1, Depth: 16}); err != nil {
		t.Fatal(err)
	}
	if m.Buckets() != 1<<16 || m.MinDepth() != 15 || m.Level != 17 {
		t.Fatalf("%d buckets at depths %d..%d", m.Buckets(), m.MinDepth(), m.Level)
	}
	return m
}

func benchRoute(b *testing.B, m *bucketmap.Map) {
	r := fileRouter(b, m)
	seed, _ := keystream.ParseSeed(clustertest.Seed)
	ks, _ := keystream.New(seed)
	uids := make([]string, 1024)
	for i := range uids {
		uids[i] = fmt.Sprintf("user-%08d@example.com", i)
	}
	var sink uint64
	var baseNS, routeNS float64
	b.ReportAllocs()
	for b.Loop() {
		// Alternate the two loops so that both see the same machine state.
		const n = 4096
		t := time.Now()
		for i := range n {
			sink += ks.Prefix64(uids[i&1023])
		}
		baseNS += float64(time.Since(t).Nanoseconds()) / n
		t = time.Now()
		for i := range n {
			rt, _ := r.Route(uids[i&1023])
			sink += uint64(rt.Bucket)
		}
		routeNS += float64(time.Since(t).Nanoseconds()) / n
	}
	_ = sink
	b.ReportMetric(routeNS/float64(b.N), "route-ns/op")
	b.ReportMetric(baseNS/float64(b.N), "prefix64-ns/op")
	b.ReportMetric(routeNS/baseNS, "x-prefix64")
	b.Logf("%d buckets at depths %d..%d: Route %.1f ns, Prefix64 %.1f ns: ratio %.3f (target <= 1.25)", m.Buckets(), m.MinDepth(), m.Level, routeNS/float64(b.N), baseNS/float64(b.N), routeNS/baseNS)
}

func TestRouteDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items, so allocations are not meaningful")
	}
	m, _ := bucketmap.New(16, clustertest.Nodes(100), t0)
	m = clustertest.Next(m)
	m.SetMoving(bucketmap.Bucket{Prefix: 1, Depth: m.Level}, m.Owner(9000), "mv")
	for _, m := range []*bucketmap.Map{m, mixedMap(t)} {
		r := fileRouter(t, m)
		if a := testing.AllocsPerRun(1000, func() { r.Route("someone@example.com") }); a != 0 {
			t.Fatalf("Route allocates %.1f times per call", a)
		}
		if a := testing.AllocsPerRun(1000, func() { r.RouteAt("someone@example.com", 1) }); a != 0 {
			t.Fatalf("RouteAt allocates %.1f times per call", a)
		}
	}
}
