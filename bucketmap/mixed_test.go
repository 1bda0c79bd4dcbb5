package bucketmap

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// The case: 3 nodes at level 2; splitting bucket 0 gives 5 buckets,
// the halves on bucket 0's owner, every other bucket untouched.
func TestSplitBucketSplitsOnlyThatBucket(t *testing.T) {
	m := bump(mustNew(t, 2, nodes(3)))
	before := m.Clone()
	if err := m.SplitBucket(at(m, 0)); err != nil {
		t.Fatal(err)
	}
	if m.Buckets() != 5 || m.Level != 3 || m.MinDepth() != 2 || m.Uniform() {
		t.Fatalf("after split 0: %d buckets, depths %d..%d", m.Buckets(), m.MinDepth(), m.Level)
	}
	want := []Bucket{{0, 3}, {1, 3}, {1, 2}, {2, 2}, {3, 2}}
	if got := m.BucketList(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("buckets %v, want %v", got, want)
	}
	for _, b := range want[2:] {
		if m.OwnerOf(b) != before.Owner(b.Prefix) {
			t.Fatalf("bucket %s changed owner", b)
		}
	}
	if m.OwnerOf(want[0]) != before.Owner(0) || m.OwnerOf(want[1]) != before.Owner(0) {
		t.Fatal("the halves left bucket 0's owner")
	}
	// Splitting a half again deepens only that part of the key space.
	if err := m.SplitBucket(Bucket{1, 3}); err != nil {
		t.Fatal(err)
	}
	if m.Buckets() != 6 || m.Level != 4 || m.MinDepth() != 2 {
		t.Fatalf("after split 1/3: %d buckets, depths %d..%d", m.Buckets(), m.MinDepth(), m.Level)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	// A bucket that is no longer one is refused with the reason.
	for _, tc := range []struct {
		b    Bucket
		want string
	}{
		{Bucket{0, 2}, "split further"},
		{Bucket{4, 3}, "part of bucket 2/2"},
		{Bucket{9, 3}, "numbers are 0..7"},
	} {
		if err := m.SplitBucket(tc.b); !errors.Is(err, ErrBucketRange) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("split %s: %v, want %q", tc.b, err, tc.want)
		}
	}
	// A moving bucket is not split.
	if err := m.SetMoving(Bucket{1, 2}, "n1", "mv-1"); err != nil && !strings.Contains(err.Error(), "already owned") {
		t.Fatal(err)
	}
	if m.OwnerOf(Bucket{1, 2}) != "n1" {
		if err := m.SplitBucket(Bucket{1, 2}); err == nil || !strings.Contains(err.Error(), "moving") {
			t.Fatalf("split of a moving bucket: %v", err)
		}
	}
}

func TestParseBucket(t *testing.T) {
	m := bump(mustNew(t, 2, nodes(2)))
	if b, err := m.ParseBucket("3"); err != nil || b != (Bucket{3, 2}) {
		t.Fatalf("3 at one depth: %v %v", b, err)
	}
	if _, err := m.ParseBucket("4"); !errors.Is(err, ErrBucketRange) || !strings.Contains(err.Error(), "the map has 4 buckets") {
		t.Fatalf("4: %v", err)
	}
	if err := m.SplitBucket(at(m, 0)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ in, want string }{
		{"1", "name one with its depth"},
		{"x", "not a bucket number"},
		{"1/x", "depth \"x\" is not a number"},
		{"1/99", "is not a number in 0..20"},
		{"0/2", "split further"},
		{"8/3", "numbers are 0..7"},
	} {
		if _, err := m.ParseBucket(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.in, err, tc.want)
		}
	}
	if b, err := m.ParseBucket("1/3"); err != nil || b != (Bucket{1, 3}) || m.Name(b) != "1/3" {
		t.Fatalf("1/3: %v %v", b, err)
	}
}

// randomMixed builds a map of mixed depths by random single-bucket splits
// and assignments.
func randomMixed(t testing.TB, rng *rand.Rand, level, nnodes, splits int) *Map {
	m := bump(mustNew(t, level, nodes(nnodes)))
	for range splits {
		bs := m.BucketList()
		b := bs[rng.IntN(len(bs))]
		if b.Depth >= MaxDepth {
			continue
		}
		if err := m.SplitBucket(b); err != nil {
			t.Fatal(err)
		}
		bs = m.BucketList()
		b = bs[rng.IntN(len(bs))]
		to := m.Nodes()[rng.IntN(nnodes)].ID
		if to != m.OwnerOf(b) {
			if err := m.Assign(b, to, AssignOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return m
}

// Every key has exactly one bucket, the one whose prefix matches it, and
// splits never move a key to another node; the record round-trips.
func TestMixedDepthsProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 26))
	for trial := range 60 {
		m := randomMixed(t, rng, rng.IntN(5), 1+rng.IntN(6), 1+rng.IntN(30))
		if err := m.Validate(); err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		bs := m.BucketList()
		if len(bs) != m.Buckets() {
			t.Fatalf("trial %d: %d listed, Buckets() %d", trial, len(bs), m.Buckets())
		}
		// The buckets tile the key space in order.
		var next int64 = -1 << 63
		for _, b := range bs {
			lo, hi := b.Keys()
			if lo != next {
				t.Fatalf("trial %d: bucket %s starts at %d, want %d", trial, b, lo, next)
			}
			next = hi + 1
			if !m.Has(b) || m.BucketOfPrefix(keystream.PrefixFromKey(lo)) != b || m.BucketOfPrefix(keystream.PrefixFromKey(hi)) != b {
				t.Fatalf("trial %d: bucket %s does not own its own keys", trial, b)
			}
		}
		if next != -1<<63 { // wrapped past the last key
			t.Fatalf("trial %d: the buckets end before the last key", trial)
		}
		for range 200 {
			p := rng.Uint64()
			b := m.BucketOfPrefix(p)
			if !b.Contains(Bucket{uint32(p >> 32 >> (32 - b.Depth) & (1<<b.Depth - 1)), b.Depth}) {
				t.Fatalf("trial %d: prefix %x in bucket %s", trial, p, b)
			}
			// The split of its bucket keeps the key's owner.
			c := m.Clone()
			if b.Depth < MaxDepth {
				if err := c.SplitBucket(b); err != nil {
					t.Fatal(err)
				}
				if c.OwnerOf(c.BucketOfPrefix(p)) != m.OwnerOf(b) {
					t.Fatalf("trial %d: splitting %s moved prefix %x", trial, b, p)
				}
			}
		}
		eachEncoding(t, fmt.Sprintf("trial %d", trial), m, func(enc MapEncoding, data []byte, back *Map) {
			again, _ := Encode(back)
			if string(again) != string(data) || fmt.Sprint(back.BucketList()) != fmt.Sprint(bs) || back.Uniform() != m.Uniform() {
				t.Fatalf("trial %d: round trip changed the map", trial)
			}
			js, _, _ := UnpackMapRecord("/m", data)
			var r MapRecord
			json.Unmarshal(js, &r)
			if want := map[bool]int{true: 1, false: 2}[m.Uniform()]; r.Version != want {
				t.Fatalf("trial %d: uniform=%v stored as format version %d", trial, m.Uniform(), r.Version)
			}
		})
		// A whole-map split doubles every bucket, keeping every owner.
		c := m.Clone()
		if c.Level < MaxLevel {
			if err := c.Split(); err != nil {
				t.Fatal(err)
			}
			if c.Buckets() != 2*m.Buckets() || c.MinDepth() != m.MinDepth()+1 {
				t.Fatalf("trial %d: whole split gave %d buckets from %d", trial, c.Buckets(), m.Buckets())
			}
			for range 100 {
				p := rng.Uint64()
				if c.OwnerOf(c.BucketOfPrefix(p)) != m.OwnerOf(m.BucketOfPrefix(p)) {
					t.Fatalf("trial %d: whole split moved prefix %x", trial, p)
				}
			}
		}
	}
}

// A map split back to one depth (every bucket split) is stored as format
// version 1 again, byte for byte as one built at that level.
func TestMixedBackToOneDepthIsFormatOne(t *testing.T) {
	m := bump(mustNew(t, 1, nodes(1)))
	for _, b := range []Bucket{{0, 1}, {1, 1}} {
		if err := m.SplitBucket(b); err != nil {
			t.Fatal(err)
		}
	}
	if !m.Uniform() || m.Level != 2 || m.Buckets() != 4 {
		t.Fatalf("depths %d..%d, %d buckets", m.MinDepth(), m.Level, m.Buckets())
	}
	js, err := EncodeJSON(m)
	if err != nil || !strings.HasPrefix(string(js), `{"version":1,`) || strings.Contains(string(js), "depths") {
		t.Fatalf("%s %v", js, err)
	}
}

// Malformed mixed records are refused, naming what is wrong; a reader
// that knows only format version 1 refuses version 2 instead of misreading
// its owners (what an older release does during a rolling upgrade).
func TestDecodeRejectsBadMixedRecords(t *testing.T) {
	m := bump(mustNew(t, 2, nodes(3)))
	if err := m.SplitBucket(at(m, 1)); err != nil {
		t.Fatal(err)
	}
	if err := m.SetMoving(Bucket{3, 3}, "n3", "mv-1"); err != nil {
		t.Fatal(err)
	}
	good, err := EncodeJSON(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode("/m", good); err != nil {
		t.Fatal(err)
	}
	b64 := func(b ...byte) string { return base64.StdEncoding.EncodeToString(b) }
	for _, tc := range []struct {
		name string
		edit func(r *MapRecord)
		want string
	}{
		{"depths in version 1", func(r *MapRecord) { r.Version = 1 }, "format version 2, not 1"},
		{"version 2 without depths", func(r *MapRecord) { r.Depths = "" }, "has none"},
		{"too few buckets", func(r *MapRecord) { r.Depths = b64(2, 3, 3, 2); r.Owners = b64(0, 0, 0, 0, 0, 1, 0, 2) }, "cover 6 of the 8"},
		{"too many", func(r *MapRecord) {
			r.Depths = b64(2, 3, 3, 2, 2, 2)
			r.Owners = b64(0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0)
		}, "more than the key space"},
		{"misaligned", func(r *MapRecord) { r.Depths = b64(3, 2, 3, 2, 2); r.Owners = b64(0, 0, 0, 0, 0, 1, 0, 2, 0, 0) }, "not a multiple"},
		{"deeper than level", func(r *MapRecord) {
			r.Depths = b64(2, 4, 4, 3, 2, 2)
			r.Owners = b64(0, 0, 0, 0, 0, 0, 0, 1, 0, 2, 0, 0)
		}, "deeper than the map's level"},
		{"one depth listed", func(r *MapRecord) {
			r.Level = 2
			r.Depths = b64(2, 2, 2, 2)
			r.Owners = b64(0, 0, 0, 0, 0, 1, 0, 2)
			r.Buckets = nil
		}, "lists no depths"},
		{"not deepest", func(r *MapRecord) {
			r.Level = 3
			r.Depths = b64(1, 2, 2)
			r.Owners = b64(0, 0, 0, 1, 0, 2)
			r.Buckets = nil
		}, "the deepest bucket is at depth 2"},
		{"owners short", func(r *MapRecord) { r.Owners = b64(0, 0) }, "want 2 per bucket"},
		{"state inside a bucket", func(r *MapRecord) { r.Buckets[0].Bucket, r.Buckets[0].Level = 1, 2 }, "split further"},
	} {
		var r MapRecord
		if err := json.Unmarshal(good, &r); err != nil {
			t.Fatal(err)
		}
		tc.edit(&r)
		js, _ := json.Marshal(r)
		_, err := Decode("/shardvisor/c/map", js)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "/shardvisor/c/map") {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	var old MapRecord
	err = topo.Decode("bucket map", "/shardvisor/c/map", good, 1, &old)
	if err == nil || !strings.Contains(err.Error(), "format version 2") {
		t.Fatalf("a version-1 reader: %v", err)
	}
	t.Logf("a release that reads only version 1 says: %v", err)
}

// Sizes at 2^16 buckets, stated in docs/bucket-map.md: a map at one depth
// is format version 1 as before; a mixed one of as many buckets (one at
// depth 15, one at 17, the rest at 16) stores one owner and one depth per
// bucket.
func TestMixedSize(t *testing.T) {
	m := bump(mustNew(t, 16, nodes(1000)))
	one, err := EncodeJSON(m)
	if err != nil {
		t.Fatal(err)
	}
	mx := bump(mustNew(t, 15, nodes(1000)))
	for p := uint32(1); p < 1<<15; p++ {
		if err := mx.SplitBucket(Bucket{p, 15}); err != nil {
			t.Fatal(err)
		}
	}
	if err := mx.SplitBucket(Bucket{1<<16 - 1, 16}); err != nil {
		t.Fatal(err)
	}
	if mx.Buckets() != 1<<16 {
		t.Fatalf("%d buckets", mx.Buckets())
	}
	mixed, err := EncodeJSON(mx)
	if err != nil {
		t.Fatal(err)
	}
	mx.Encoding = MapGzip
	mixedGz, _ := Encode(mx)
	t.Logf("2^16 buckets at one depth: %d bytes; %d buckets at depths %d..%d: %d bytes (%d gzip)", len(one), mx.Buckets(), mx.MinDepth(), mx.Level, len(mixed), len(mixedGz))
	if len(mixed) > zksession.MaxDataSize/2 {
		t.Fatalf("mixed map %d bytes, over half the znode limit", len(mixed))
	}
	if !strings.HasPrefix(string(one), `{"version":1,`) {
		t.Fatal("a map at one depth is no longer format version 1")
	}
}

// The planner by count works on buckets whatever their depth: it reaches
// the lower bound and a balanced result.
func TestPlannerAtMixedDepths(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	for trial := range 40 {
		m := randomMixed(t, rng, 2+rng.IntN(3), 1+rng.IntN(4), rng.IntN(40))
		if rng.IntN(2) == 0 {
			if err := m.AddNode(node(fmt.Sprintf("x%d", trial), 1+rng.IntN(3))); err != nil {
				t.Fatal(err)
			}
		}
		p := planOf(t, m)
		seen := map[Bucket]bool{}
		for _, mv := range p.Moves {
			if !m.Has(mv.Bucket) || m.OwnerOf(mv.Bucket) != mv.From || seen[mv.Bucket] {
				t.Fatalf("trial %d: bad move %+v", trial, mv)
			}
			seen[mv.Bucket] = true
		}
		if len(p.Moves) != p.LowerBound {
			t.Fatalf("trial %d: %d moves, lower bound %d", trial, len(p.Moves), p.LowerBound)
		}
		c := m.Clone()
		if err := c.Apply(p); err != nil {
			t.Fatal(err)
		}
		checkBalanced(t, c, fmt.Sprintf("trial %d", trial))
	}
}
