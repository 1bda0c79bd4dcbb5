package bucketmap

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func node(id string, w int) Node {
	return Node{ID: NodeID(id), DSN: "postgres://app@" + id + ".db:5432/app", Password: "env:PG_" + strings.ToUpper(strings.ReplaceAll(id, "-", "_")), Weight: w, State: NodeActive}
}

func nodes(n int) []Node {
	out := make([]Node, n)
	for i := range out {
		out[i] = node(fmt.Sprintf("n%d", i+1), 1)
	}
	return out
}

func mustNew(t testing.TB, level int, ns []Node) *Map {
	t.Helper()
	m, err := New(level, ns, t0)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// bump mimics Store.Update: edits happen on a clone at the next version.
func bump(m *Map) *Map {
	c := m.Clone()
	c.Version++
	c.UpdatedAt = c.UpdatedAt.Add(time.Minute)
	return c
}

func TestNewDealsContiguousRunsByWeight(t *testing.T) {
	m := mustNew(t, 4, []Node{node("a", 1), node("b", 2), node("c", 1)})
	got := ""
	for b := range m.Buckets() {
		got += string(m.Owner(uint32(b)))
	}
	// 16 buckets by weight 1:2:1 = 4, 8, 4, in node order.
	if got != "aaaabbbbbbbbcccc" {
		t.Fatalf("layout %s", got)
	}
	if m.Version != 1 || len(m.History()) != 0 || len(m.NonActive()) != 0 {
		t.Fatalf("fresh map %+v", m)
	}
	if _, err := New(MaxLevel+1, nodes(1), t0); err == nil {
		t.Fatal("level above MaxLevel accepted")
	}
	if _, err := New(3, nil, t0); err == nil {
		t.Fatal("no nodes accepted")
	}
	if _, err := New(3, []Node{node("a", 1), node("a", 1)}, t0); err == nil {
		t.Fatal("duplicate node accepted")
	}
}

func TestValidateNodeInputs(t *testing.T) {
	good := node("n1", 1)
	if err := ValidateNode(good); err != nil {
		t.Fatal(err)
	}
	wantInvalidNodes(t, good, []badNode{
		{func(n *Node) { n.ID = "N1" }, "node name"},
		{func(n *Node) { n.DSN = "postgres://app:hunter2@h/db" }, "contains a password"},
		{func(n *Node) { n.DSN = "postgres://app@h/db?password=hunter2" }, "password parameter"},
		{func(n *Node) { n.DSN = "mysql://h/db" }, "postgres:// URL"},
		{func(n *Node) { n.DSN = "postgres:///db" }, "no host"},
		{func(n *Node) { n.Password = "hunter2" }, "must be env:NAME or file:/path"},
		{func(n *Node) { n.Password = "env:1BAD" }, "not an environment variable name"},
		{func(n *Node) { n.Password = "file:relative" }, "must be absolute"},
		{func(n *Node) { n.Weight = 0 }, "weight 0"},
		{func(n *Node) { n.Weight = MaxWeight + 1 }, "weight"},
		{func(n *Node) { n.State = "zombie" }, `state "zombie"`},
		{func(n *Node) { n.StreamUser = "Bad-Name" }, "must be a role name"},
		{func(n *Node) { n.StreamUser = "shardvisor_stream" }, "must set sslmode=verify-full"},
		{func(n *Node) { n.PoolDSN = "postgres://app:hunter2@h:6432/db" }, "pool dsn"},
		{func(n *Node) { n.PoolDSN = "mysql://h/db" }, "pool dsn"},
		{func(n *Node) {
			n.DSN = "postgres://app@h:5432/db?sslmode=verify-full&sslrootcert=/ca.crt"
			n.PoolDSN = "postgres://app@h:6432/db?sslmode=require"
		}, "verifies its server less than the dsn does (sslmode require against verify-full)"},
		{func(n *Node) {
			n.DSN = "postgres://app@h:5432/db?sslmode=require"
			n.PoolDSN = "postgres://app@h:6432/db"
		}, "sslmode prefer against require"},
		{func(n *Node) {
			n.DSN = "postgres://app@h1,h2/db?target_session_attrs=read-write"
			n.PoolDSN = "postgres://app@h1:6432,h2:6432/db"
			n.Patroni = Patroni{Namespace: DefaultPatroniNamespace, Scope: "g1"}
		}, "pool dsn"},
	})
}

// roundTripField encodes a map of ns and decodes it back, after checking
// that the same map without ns's optional settings (the plain nodes(n))
// never mentions field.
func roundTripField(t *testing.T, ns []Node, field string) *Map {
	t.Helper()
	plain, err := Encode(mustNew(t, 2, nodes(len(ns))))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(plain), field) {
		t.Fatalf("a map without it mentions %s: %s", field, plain)
	}
	data, err := Encode(mustNew(t, 2, ns))
	if err != nil {
		t.Fatal(err)
	}
	back, err := Decode("/m", data)
	if err != nil {
		t.Fatal(err)
	}
	return back
}

// A pooler goes through the record and back, and SetConnection replaces
// it; a map without one does not mention it, and its nodes' application
// path is their DSN.
func TestPoolDSNRoundTrip(t *testing.T) {
	ns := nodes(2)
	pool := "postgres://app@10.0.0.2:6432/app"
	ns[1].PoolDSN = pool
	back := roundTripField(t, ns, "pool_dsn")
	n2, _ := back.Node("n2")
	if n2.PoolDSN != pool || n2.AppDSN() != pool || !n2.Pooled() {
		t.Fatalf("decoded %+v", n2)
	}
	if n1, _ := back.Node("n1"); n1.Pooled() || n1.AppDSN() != n1.DSN {
		t.Fatalf("n1 got a pooler: %+v", n1)
	}
	n2.PoolDSN = ""
	if err := back.SetConnection("n2", n2); err != nil {
		t.Fatal(err)
	}
	if n, _ := back.Node("n2"); n.Pooled() {
		t.Fatalf("SetConnection kept the pooler: %+v", n)
	}
	n2.PoolDSN = "postgres://app:pw@h/db"
	if err := back.SetConnection("n2", n2); err == nil || !strings.Contains(err.Error(), "pool dsn") {
		t.Fatalf("SetConnection took a pool dsn with a password: %v", err)
	}
}

// A stream user goes through the record and back; a map without one
// does not mention it.
func TestStreamUserRoundTrip(t *testing.T) {
	ns := nodes(2)
	ns[1].DSN += "?sslmode=verify-full&sslrootcert=/etc/ca.crt"
	ns[1].StreamUser = "shardvisor_stream"
	back := roundTripField(t, ns, "stream_user")
	if n, _ := back.Node("n2"); n.StreamUser != "shardvisor_stream" {
		t.Fatalf("decoded %+v", n)
	}
	if n, _ := back.Node("n1"); n.StreamUser != "" {
		t.Fatalf("n1 got a stream user: %+v", n)
	}
}

func TestRoundTripAndSize(t *testing.T) {
	for _, tc := range []struct{ level, nodes int }{{0, 1}, {3, 3}, {16, 1000}, {MaxLevel, 1000}} {
		m := mustNew(t, tc.level, nodes(tc.nodes))
		m = bump(m)
		// Some state to carry: a move, lost data, history.
		if tc.level > 0 {
			if err := m.SetMoving(at(m, 0), m.Owner(uint32(m.Buckets()-1)), "mv-1"); err != nil {
				t.Fatal(err)
			}
			if err := m.Assign(at(m, uint32(m.Buckets()-1)), m.Owner(0), AssignOptions{NoCopy: true}); err != nil {
				t.Fatal(err)
			}
		}
		eachEncoding(t, fmt.Sprintf("level %d", tc.level), m, func(enc MapEncoding, data []byte, back *Map) {
			if back.Encoding != enc {
				t.Fatalf("level %d: a %s record decodes as %s", tc.level, enc, back.Encoding)
			}
			again, _ := Encode(back)
			if string(again) != string(data) {
				t.Fatalf("level %d, %s: encode(decode(x)) != x", tc.level, enc)
			}
			if tc.level == 16 {
				// Stated in docs/bucket-map.md.
				t.Logf("level 16 with %d nodes, %s: %d bytes (%.1f KiB) of %d allowed", tc.nodes, enc, len(data), float64(len(data))/1024, zksession.MaxDataSize)
			}
			if len(data) > zksession.MaxDataSize/2 {
				t.Fatalf("level %d, %d nodes, %s: %d bytes, over half the znode limit", tc.level, tc.nodes, enc, len(data))
			}
		})
	}
}

// The two forms of one map decode to the same map, and DecodeRecord hands
// back the same plain JSON for both: the bytes of the plain form itself,
// which is what the map file embeds.
func TestDecodeRecordBothForms(t *testing.T) {
	m := bump(mustNew(t, 8, nodes(5)))
	if err := m.SetMoving(at(m, 3), m.Owner(200), "mv-1"); err != nil {
		t.Fatal(err)
	}
	plain, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if js, err := EncodeJSON(m); err != nil || string(js) != string(plain) {
		t.Fatalf("EncodeJSON of a map built by New is not its plain record: %v", err)
	}
	gz := m.Clone()
	gz.Encoding = MapGzip
	packed, err := Encode(gz)
	if err != nil {
		t.Fatal(err)
	}
	if len(packed) >= len(plain)/4 || packed[0] != 0x1f {
		t.Fatalf("gzip record: %d bytes (plain %d), first byte %#x", len(packed), len(plain), packed[0])
	}
	for _, data := range [][]byte{plain, packed} {
		back, js, err := DecodeRecord("/m", data)
		if err != nil {
			t.Fatal(err)
		}
		if string(js) != string(plain) {
			t.Fatalf("%s: DecodeRecord's JSON differs from the plain record", back.Encoding)
		}
		if again, _ := EncodeJSON(back); string(again) != string(plain) || back.Meta(3).Move != "mv-1" {
			t.Fatalf("%s: decodes to another map", back.Encoding)
		}
		// Edits keep the form (Store.Update works on a Clone).
		if c := back.Clone(); c.Encoding != back.Encoding {
			t.Fatalf("Clone dropped the encoding %s", back.Encoding)
		}
	}
}

// A damaged compressed record is refused with the znode named, as a
// damaged plain one is.
func TestDecodeCorruptCompressed(t *testing.T) {
	m := mustNew(t, 6, nodes(3))
	m.Encoding = MapGzip
	data, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0x55
	_, err = Decode("/shardvisor/c/map", data)
	if err == nil || !errors.Is(err, topo.ErrMalformed) || !strings.Contains(err.Error(), "bucket map at /shardvisor/c/map: malformed record: gzip-compressed record: corrupt") {
		t.Fatalf("corrupt compressed record: %v", err)
	}
}

// rec returns a good record to corrupt.
func rec(t *testing.T) *MapRecord {
	m := bump(mustNew(t, 2, nodes(2)))
	if err := m.Assign(at(m, 0), "n2", AssignOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetMoving(at(m, 3), "n1", "mv-9"); err != nil {
		t.Fatal(err)
	}
	data, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	r, err := DecodeMapRecord("", data)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestDecodeRejectsInconsistentMaps(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mut    func(r *MapRecord)
		errHas string
	}{
		{"format version", func(r *MapRecord) { r.Version = 9 }, "format version 9"},
		{"map version 0", func(r *MapRecord) { r.MapVersion = 0 }, "map version 0"},
		{"level", func(r *MapRecord) { r.Level = 40 }, "level 40 out of range"},
		{"wrong bucket count", func(r *MapRecord) { r.Level = 3 }, "owners: 8 bytes, want 16"},
		{"owners not base64", func(r *MapRecord) { r.Owners = "!!" }, "not base64"},
		{"owner index", func(r *MapRecord) { r.Owners = "AAAAAQACAAE=" }, "owner index 2 is not in the registry"},
		{"no nodes", func(r *MapRecord) { r.Nodes = nil }, "no db nodes"},
		{"duplicate node", func(r *MapRecord) { r.Nodes[1].ID = r.Nodes[0].ID }, "listed twice"},
		{"bad node state", func(r *MapRecord) { r.Nodes[0].State = "gone" }, `state "gone"`},
		{"password in dsn", func(r *MapRecord) { r.Nodes[0].DSN = "postgres://u:p@h/db" }, "contains a password"},
		{"removed owner", func(r *MapRecord) { r.Nodes[0].State = "removed" }, "owned by removed node n1"},
		{"unknown history node", func(r *MapRecord) { r.History[0].Node = "ghost" }, `unknown node "ghost"`},
		{"history range", func(r *MapRecord) { r.History[0].Hi = 4 }, "bucket range 0..4 outside 0..3"},
		{"history from the future", func(r *MapRecord) { r.History[0].UntilVersion = 99 }, "until map version 99"},
		{"moving to unknown", func(r *MapRecord) { r.Buckets[0].Target = "ghost" }, `moving to unknown node "ghost"`},
		{"moving to owner", func(r *MapRecord) { r.Buckets[0].Target = "n2" }, "moving to its own owner"},
		{"moving without id", func(r *MapRecord) { r.Buckets[0].Move = "" }, "names no move id"},
		{"bucket out of range", func(r *MapRecord) { r.Buckets[0].Bucket = 4 }, "bucket 4, the map has 4 buckets"},
		{"bucket state", func(r *MapRecord) { r.Buckets[0].State = "fenced" }, `state "fenced"`},
		{"plain bucket listed", func(r *MapRecord) { r.Buckets[0] = BucketRecord{Bucket: 3, State: "active"} }, "plain active"},
		{"duplicate bucket", func(r *MapRecord) { r.Buckets = append(r.Buckets, r.Buckets[0]) }, "listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rec(t)
			tc.mut(r)
			data, _ := json.Marshal(r)
			packed, err := PackMapRecord(data, MapGzip)
			if err != nil {
				t.Fatal(err)
			}
			// Compressed, the same record fails the same way.
			for _, data := range [][]byte{data, packed} {
				_, err := Decode("/shardvisor/c/map", data)
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("got %v, want an error containing %q", err, tc.errHas)
				}
				if !errors.Is(err, topo.ErrMalformed) || !strings.Contains(err.Error(), "/shardvisor/c/map") {
					t.Fatalf("error should wrap ErrMalformed and name the znode: %v", err)
				}
			}
		})
	}
	if _, err := Decode("/m", []byte(`{"version":1,"map_version":1,"level":0,"owners":"AAA=","nodes":[],"extra":true}`)); err == nil || !strings.Contains(err.Error(), `unknown field "extra"`) {
		t.Fatalf("unknown field: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	for _, m := range []*Map{mustNew(f, 0, nodes(1)), mustNew(f, 3, nodes(3))} {
		data, _ := Encode(m)
		f.Add(data)
		m.Encoding = MapGzip
		data, _ = Encode(m)
		f.Add(data)
	}
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"map_version":2,"level":1,"nodes":[{"id":"a","dsn":"postgres://h/d","weight":1,"state":"active"}],"owners":"AAAAAA==","history":[{"lo":0,"hi":1,"node":"a","until_version":1,"at":"2026-01-01T00:00:00Z"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, js, err := DecodeRecord("/fuzz", data)
		if err != nil {
			return
		}
		// Whatever decodes is consistent and survives a round trip in the
		// form it came in.
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded an invalid map: %v", err)
		}
		enc, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := Decode("/fuzz", enc)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if m2.Encoding != m.Encoding {
			t.Fatalf("a %s record re-encodes as %s", m.Encoding, m2.Encoding)
		}
		enc2, _ := Encode(m2)
		if string(enc) != string(enc2) {
			t.Fatal("round trip not stable")
		}
		// The plain JSON handed on (the map file) is that same map.
		m3, err := Decode("/fuzz", js)
		if err != nil {
			t.Fatalf("the record's JSON does not decode: %v", err)
		}
		a, _ := EncodeJSON(m)
		b, _ := EncodeJSON(m3)
		if string(a) != string(b) {
			t.Fatal("the record's JSON is another map")
		}
	})
}

// Every user routes to the same node before and after any number of splits.
func TestSplitKeepsEveryUserOnItsNode(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 20 {
		seed := make([]byte, 16)
		for i := range seed {
			seed[i] = byte(rng.IntN(256))
		}
		ks, err := keystream.New(seed)
		if err != nil {
			t.Fatal(err)
		}
		m := bump(mustNew(t, rng.IntN(5), nodes(1+rng.IntN(6))))
		// Scramble ownership so the test is not only about contiguous runs.
		for range m.Buckets() {
			b := uint32(rng.IntN(m.Buckets()))
			to := m.Nodes()[rng.IntN(len(m.Nodes()))].ID
			if to != m.Owner(b) {
				if err := m.Assign(at(m, b), to, AssignOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		uids := make([]string, 300)
		before := make([]NodeID, len(uids))
		for i := range uids {
			uids[i] = fmt.Sprintf("user-%d-%d", trial, rng.Int())
			before[i] = m.OwnerOf(m.BucketOf(ks, uids[i]))
		}
		hist := len(m.History())
		for range 1 + rng.IntN(6) {
			if m.Level == MaxLevel {
				break
			}
			if err := m.Split(); err != nil {
				t.Fatal(err)
			}
			if err := m.Validate(); err != nil {
				t.Fatal(err)
			}
		}
		for i, uid := range uids {
			if got := m.OwnerOf(m.BucketOf(ks, uid)); got != before[i] {
				t.Fatalf("trial %d: %s moved from %s to %s after splitting", trial, uid, before[i], got)
			}
		}
		if len(m.History()) != hist {
			t.Fatalf("split changed the number of history entries")
		}
	}
}

func TestSplitCarriesHistoryAndFlags(t *testing.T) {
	m := bump(mustNew(t, 2, nodes(2)))
	if err := m.Assign(at(m, 1), "n2", AssignOptions{NoCopy: true}); err != nil {
		t.Fatal(err)
	}
	if err := m.Split(); err != nil {
		t.Fatal(err)
	}
	for _, b := range []uint32{2, 3} {
		if m.Owner(b) != "n2" || !m.Meta(b).DataLost {
			t.Fatalf("bucket %d: owner %s meta %+v", b, m.Owner(b), m.Meta(b))
		}
		if h := m.HistoryOf(b); len(h) != 1 || h[0].Node != "n1" {
			t.Fatalf("bucket %d history %+v", b, h)
		}
	}
	if h := m.HistoryOf(4); len(h) != 0 {
		t.Fatalf("bucket 4 history %+v", h)
	}
	if err := m.SetMoving(at(m, 0), "n2", "mv"); err != nil {
		t.Fatal(err)
	}
	if err := m.Split(); err == nil || !strings.Contains(err.Error(), "moving") {
		t.Fatalf("split during a move: %v", err)
	}
	top := mustNew(t, MaxLevel, nodes(1))
	if err := top.Split(); err == nil {
		t.Fatal("split above MaxLevel")
	}
}

func TestAssignHistoryAndReturn(t *testing.T) {
	m := bump(mustNew(t, 2, nodes(3))) // n1: 0,1  n2: 2  n3: 3
	if err := m.Assign(at(m, 0), "n2", AssignOptions{}); err != nil {
		t.Fatal(err)
	}
	h := m.HistoryOf(0)
	if len(h) != 1 || h[0].Node != "n1" || h[0].UntilVersion != m.Version || !h[0].At.Equal(m.UpdatedAt) {
		t.Fatalf("history %+v", h)
	}
	// Back to n1: n1 owns it again, so its rows are not leftovers any more.
	m = bump(m)
	if err := m.Assign(at(m, 0), "n1", AssignOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, h := range m.HistoryOf(0) {
		if h.Node == "n1" {
			t.Fatalf("n1 owns bucket 0 again but history still lists it: %+v", m.HistoryOf(0))
		}
	}
	for _, tc := range []struct {
		b      uint32
		to     NodeID
		errHas string
	}{
		{9, "n1", "bucket 9, the map has 4 buckets"},
		{0, "ghost", "unknown db node"},
		{0, "n1", "already owned"},
	} {
		if err := m.Assign(at(m, tc.b), tc.to, AssignOptions{}); err == nil || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("Assign(%d, %s) = %v, want %q", tc.b, tc.to, err, tc.errHas)
		}
	}
	if err := m.Drain("n3"); err != nil {
		t.Fatal(err)
	}
	if err := m.Assign(at(m, 0), "n3", AssignOptions{}); err == nil || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("assign to a draining node: %v", err)
	}
	if err := m.SetMoving(at(m, 1), "n2", "mv-1"); err != nil {
		t.Fatal(err)
	}
	if err := m.Assign(at(m, 1), "n3", AssignOptions{}); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("assign a moving bucket elsewhere: %v", err)
	}
	if err := m.Activate("n3"); err != nil {
		t.Fatal(err)
	}
	if err := m.Assign(at(m, 1), "n3", AssignOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if m.Meta(1).State != BucketActive {
		t.Fatal("forced assign left the bucket moving")
	}
}

func TestMarkDownReassignsByWeightWithoutCopy(t *testing.T) {
	m := bump(mustNew(t, 6, []Node{node("a", 1), node("b", 1), node("c", 2), node("d", 1)}))
	owned := m.Counts()["b"]
	re, err := m.MarkDown("b")
	if err != nil {
		t.Fatal(err)
	}
	if len(re) != owned {
		t.Fatalf("reassigned %d of b's %d buckets", len(re), owned)
	}
	c := m.Counts()
	if c["b"] != 0 {
		t.Fatalf("down node still owns %d", c["b"])
	}
	// 64 buckets over weights a1 c2 d1: 16, 32, 16.
	if c["a"] != 16 || c["c"] != 32 || c["d"] != 16 {
		t.Fatalf("counts after b went down: %v", c)
	}
	for _, mv := range re {
		if !m.MetaOf(mv.Bucket).DataLost || m.HistoryOf(mv.Prefix)[0].Node != "b" {
			t.Fatalf("bucket %s not marked lost with b in history", mv.Bucket)
		}
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	only := bump(mustNew(t, 2, nodes(1)))
	if _, err := only.MarkDown("n1"); !errors.Is(err, ErrNoActiveNode) {
		t.Fatalf("last node down: %v", err)
	}
	if only.Nodes()[0].State != NodeActive {
		t.Fatal("failed MarkDown changed the node state")
	}
}

func TestRemoveNodeCompactsOnlyWhenUnreferenced(t *testing.T) {
	m := bump(mustNew(t, 2, nodes(3)))
	if err := m.RemoveNode("n1"); err == nil || !strings.Contains(err.Error(), "owns 2 buckets") {
		t.Fatalf("remove an owner: %v", err)
	}
	for _, b := range []uint32{0, 1} {
		if err := m.Assign(at(m, b), "n2", AssignOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.RemoveNode("n1"); err != nil {
		t.Fatal(err)
	}
	// History still names n1, so it stays, as removed; it is not a live
	// node (schema changes do not wait for it), nor is one marked down.
	if n, ok := m.Node("n1"); !ok || n.State != NodeRemoved {
		t.Fatalf("n1 after removal: %+v %v", n, ok)
	}
	down := m.Clone()
	if _, err := down.MarkDown("n3"); err != nil {
		t.Fatal(err)
	}
	if live := down.LiveNodes(); len(live) != 1 || live[0].ID != "n2" {
		t.Fatalf("live nodes: %+v", live)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := m.PruneHistory(func(h Handoff) bool { return h.Node == "n1" }); got != 2 {
		t.Fatalf("pruned %d", got)
	}
	if _, ok := m.Node("n1"); ok {
		t.Fatal("n1 still in the registry after its history was pruned")
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("compaction broke the map: %v", err)
	}
	if m.Owner(3) != "n3" || m.Owner(0) != "n2" {
		t.Fatalf("owners renumbered wrongly: %s %s", m.Owner(0), m.Owner(3))
	}
}
