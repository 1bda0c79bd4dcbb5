package sidecar

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/router"
)

// routingVectorsFile is shared with the Python package's tests
// (clients/python/tests/test_routing_vectors.py): Go writes it, Python
// reads it and must give the same answers.
const routingVectorsFile = "../clients/python/tests/data/routing_vectors.json.gz"

type routingVectors struct {
	Comment string       `json:"comment"`
	UIDs    []string     `json:"uids"`
	Maps    []vectorsMap `json:"maps"`
}

type vectorsMap struct {
	Name string `json:"name"`
	// MapFile is the map file exactly as the supervisor writes it and
	// GET /v1/map serves it.
	MapFile json.RawMessage `json:"map_file"`
	// Routes holds, per uid in order, what `shardctl route --json UID`
	// prints for that map (both go through router.Route and JSONRoute).
	Routes []json.RawMessage `json:"routes"`
}

// TestRoutingVectorsFile builds the shared vectors from the Go router and
// requires the committed file to hold exactly them. After a deliberate
// change, rewrite it with
//
//	SHARDVISOR_UPDATE_VECTORS=1 go test -run TestRoutingVectorsFile ./sidecar/
func TestRoutingVectorsFile(t *testing.T) {
	want := buildRoutingVectors(t)
	data, err := json.MarshalIndent(want, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("SHARDVISOR_UPDATE_VECTORS") == "1" {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression) // no name, no mtime: the same bytes every time
		zw.Write(data)
		zw.Close()
		if err := os.WriteFile(routingVectorsFile, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s: %d maps, %d uids, %d bytes (%d uncompressed)", routingVectorsFile, len(want.Maps), len(want.UIDs), buf.Len(), len(data))
		return
	}
	f, err := os.Open(routingVectorsFile)
	if err != nil {
		t.Fatalf("%v (write it with SHARDVISOR_UPDATE_VECTORS=1 go test -run TestRoutingVectorsFile ./sidecar/)", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	have, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, data) {
		t.Fatalf("%s is not what the Go router answers now: rewrite it with SHARDVISOR_UPDATE_VECTORS=1 go test -run TestRoutingVectorsFile ./sidecar/ (and check why the answers changed)", routingVectorsFile)
	}
	// The file reaches what it claims to: every level 0..16 and several
	// depths in one mixed map.
	levels := map[int]bool{}
	for _, m := range want.Maps {
		var rt struct{ Level int }
		for _, r := range m.Routes {
			json.Unmarshal(r, &rt)
			levels[rt.Level] = true
		}
	}
	for l := 0; l <= 16; l++ {
		if !levels[l] {
			t.Errorf("no route at level %d", l)
		}
	}
}

func buildRoutingVectors(t *testing.T) routingVectors {
	t.Helper()
	ks, err := keystream.New(mustSeed(t))
	if err != nil {
		t.Fatal(err)
	}
	uids := []string{"alice", "bob", "ünïcødé", "\u00e9", "e\u0301", "用户-42", "😀", "مستخدم", "user-42@example.com",
		"tab\there", "new\nline", "quote\"back\\slash", "x", string(make([]byte, 0)) + "zero\x00byte", "Ω≈ç√∫"}
	for i := range 200 {
		uids = append(uids, fmt.Sprintf("u%d", i))
	}
	// Users in the deepest buckets of the mixed map below (bucket 0 at
	// depth 12 and deeper): found by search, as 1 in 4,096 users is.
	for i, n := 0, 0; n < 24; i++ {
		u := fmt.Sprintf("deep-%d", i)
		if keystream.BucketOf(ks.Prefix64(u), 12) == 0 {
			uids = append(uids, u)
			n++
		}
	}
	rng := rand.New(rand.NewPCG(28, 1))
	nodes := clustertest.Nodes(4)
	nodes[3].DSN = "postgres://app@db4a:5432,db4b:5432/app?target_session_attrs=read-write"
	nodes[3].Patroni = bucketmap.Patroni{Namespace: bucketmap.DefaultPatroniNamespace, Scope: "pg4"}
	var out routingVectors
	out.Comment = "Written by sidecar.TestRoutingVectorsFile from the Go router; read by clients/python/tests. Each route is what `shardctl route --json` prints."
	out.UIDs = uids
	add := func(name string, m *bucketmap.Map) {
		if err := m.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		path := clustertest.WriteMapFile(t, t.TempDir(), m)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		r, err := router.NewFromFile(path, router.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		vm := vectorsMap{Name: name, MapFile: data}
		for _, u := range uids {
			rt, err := r.Route(u)
			if err != nil {
				t.Fatal(err)
			}
			vm.Routes = append(vm.Routes, JSONRoute(u, rt))
		}
		out.Maps = append(out.Maps, vm)
	}
	for level := 0; level <= 16; level++ {
		m, err := bucketmap.New(level, nodes, t0)
		if err != nil {
			t.Fatal(err)
		}
		m = clustertest.Next(m)
		owners := m.OwnerIndexes() // owners at random, without a handoff per bucket
		for i := range owners {
			owners[i] = uint16(rng.IntN(len(nodes)))
		}
		if level >= 3 {
			b := bucketmap.Bucket{Prefix: 5, Depth: level}
			if err := m.SetMoving(b, otherNode(m, 5), "mv-5"); err != nil {
				t.Fatal(err)
			}
			if err := m.Assign(bucketmap.Bucket{Prefix: 6, Depth: level}, otherNode(m, 6), bucketmap.AssignOptions{NoCopy: true}); err != nil {
				t.Fatal(err)
			}
		}
		add(fmt.Sprintf("level %d", level), m)
	}
	mx := mixedMap(t, nodes)
	add("mixed depths 3..9", mx)
	// Mixed depths 2..16: bucket 0 split down to depth 16, each half at
	// its depth on a node of its own.
	deep, _ := bucketmap.New(2, nodes, t0)
	deep = clustertest.Next(deep)
	for d := 2; d < 16; d++ {
		if err := deep.SplitBucket(bucketmap.Bucket{Prefix: 0, Depth: d}); err != nil {
			t.Fatal(err)
		}
		half := bucketmap.Bucket{Prefix: 1, Depth: d + 1}
		to := bucketmap.NodeID(fmt.Sprintf("pg%d", 1+d%4))
		if deep.Owner(uint32(1)<<(deep.Level-(d+1))) != to {
			if err := deep.Assign(half, to, bucketmap.AssignOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	add("mixed depths 2..16", deep)
	return out
}

// mixedMap is a map of depths 3..9 over nodes: buckets split at several
// depths, halves moved apart, a half in a move.
func mixedMap(t *testing.T, nodes []bucketmap.Node) *bucketmap.Map {
	t.Helper()
	mx, _ := bucketmap.New(3, nodes, t0)
	mx = clustertest.Next(mx)
	for _, b := range []bucketmap.Bucket{{Prefix: 0, Depth: 3}, {Prefix: 1, Depth: 4}, {Prefix: 3, Depth: 5}, {Prefix: 7, Depth: 6}, {Prefix: 15, Depth: 7}, {Prefix: 31, Depth: 8}, {Prefix: 5, Depth: 3}} {
		if err := mx.SplitBucket(b); err != nil {
			t.Fatal(err)
		}
	}
	last := nodes[len(nodes)-1].ID
	if err := mx.Assign(bucketmap.Bucket{Prefix: 63, Depth: 9}, last, bucketmap.AssignOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := mx.SetMoving(bucketmap.Bucket{Prefix: 10, Depth: 4}, otherNode(mx, 10<<(mx.Level-4)), "mv-10"); err != nil {
		t.Fatal(err)
	}
	return mx
}

func otherNode(m *bucketmap.Map, slot uint32) bucketmap.NodeID {
	for _, n := range m.Nodes() {
		if n.ID != m.Owner(slot) {
			return n.ID
		}
	}
	panic("one node")
}

func mustSeed(t *testing.T) []byte {
	t.Helper()
	s, err := keystream.ParseSeed(clustertest.Seed)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
