package fence

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/keystream"
)

func testMap(t testing.TB, level int, ids ...string) *bucketmap.Map {
	t.Helper()
	var nodes []bucketmap.Node
	for _, id := range ids {
		nodes = append(nodes, bucketmap.Node{ID: bucketmap.NodeID(id), DSN: "postgres://127.0.0.1/" + id, Weight: 1, State: bucketmap.NodeActive})
	}
	m, err := bucketmap.New(level, nodes, time.Unix(1700000000, 0).UTC())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestGranule(t *testing.T) {
	if Granule(math.MinInt64) != 0 || Granule(math.MaxInt64) != 1<<LockLevel-1 {
		t.Fatal("granule bounds")
	}
	// The trigger's arithmetic, ((k >> 54) + 512), is Granule.
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		k := int64(r.Uint64())
		if got := int32((k >> (64 - LockLevel)) + 1<<(LockLevel-1)); got != Granule(k) {
			t.Fatalf("key %d: SQL formula %d, Granule %d", k, got, Granule(k))
		}
	}
	if LockClass != 0x5356000a {
		t.Fatalf("lock class %x is part of the documented contract", LockClass)
	}
}

func TestDesiredMergesAndCovers(t *testing.T) {
	m := testMap(t, 6, "a", "b", "c")
	all := map[bucketmap.NodeID][]Span{}
	for _, id := range []bucketmap.NodeID{"a", "b", "c"} {
		all[id] = Desired(m, id)
		if len(all[id]) != 1 { // New deals contiguous runs
			t.Fatalf("%s: %v", id, all[id])
		}
	}
	if all["a"][0].Lo != math.MinInt64 || all["c"][0].Hi != math.MaxInt64 || all["a"][0].Hi+1 != all["b"][0].Lo {
		t.Fatalf("spans do not tile the key space: %v", all)
	}
	// A moving bucket: still owned at the owner (only its mover freezes
	// it), incoming at the target.
	next := m.Clone()
	next.Version++
	if err := next.SetMoving(bucketmap.Bucket{Prefix: 3, Depth: next.Level}, "c", "mv1"); err != nil {
		t.Fatal(err)
	}
	a, c := Desired(next, "a"), Desired(next, "c")
	lo, hi, _ := keystream.Range(6, 3)
	if len(a) != 1 || a[0].Lo > lo || a[0].Hi < hi || a[0].State != Owned {
		t.Fatalf("owner of a moving bucket: %v", a)
	}
	if len(c) != 2 || c[0] != (Span{lo, hi, Incoming, next.Version}) {
		t.Fatalf("target of a moving bucket: %v", c)
	}
}

// Wanted never freezes a moving bucket, keeps the freeze its mover made
// while the map says moving, and thaws it once the map says otherwise.
func TestWantedKeepsOnlyTheMoversFreeze(t *testing.T) {
	m := testMap(t, 6, "a", "b", "c")
	b := bucketmap.Bucket{Prefix: 3, Depth: m.Level}
	lo, hi, _ := keystream.Range(6, 3)
	moving := m.Clone()
	moving.Version = m.Version + 1
	if err := moving.SetMoving(b, "c", "mv1"); err != nil {
		t.Fatal(err)
	}
	stateAt := func(spans []Span, k int64) State {
		for _, s := range spans {
			if s.Lo <= k && k <= s.Hi {
				return s.State
			}
		}
		return Absent
	}
	owned := Desired(m, "a")
	// Before the mover's freeze: a sync with the moving map keeps the
	// bucket owned (writers go on while the members catch up).
	if got := Wanted(owned, moving, "a"); stateAt(got, lo) != Owned || stateAt(got, hi) != Owned || len(Compare(got, owned)) != 0 {
		t.Fatalf("before the freeze: %v", got)
	}
	// After it: kept frozen, with the mover's epoch, only on the bucket.
	frozen := overlay(owned, []Span{{Lo: lo, Hi: hi, State: Frozen, Epoch: moving.Version}})
	got := Wanted(frozen, moving, "a")
	if d := Compare(got, frozen); len(d) != 0 {
		t.Fatalf("the mover's freeze not kept: %v", d)
	}
	// A frozen range wider than the moving bucket (drift): only the
	// bucket's part stays frozen.
	wide := overlay(owned, []Span{{Lo: lo - 5, Hi: hi + 5, State: Frozen, Epoch: 1}})
	got = Wanted(wide, moving, "a")
	if stateAt(got, lo-5) != Owned || stateAt(got, hi+5) != Owned || stateAt(got, lo) != Frozen || stateAt(got, hi) != Frozen {
		t.Fatalf("drift around the moving bucket: %v", got)
	}
	// The map no longer says moving (aborted): owned again.
	aborted := m.Clone()
	aborted.Version = moving.Version + 1
	if got := Wanted(frozen, aborted, "a"); stateAt(got, lo) != Owned {
		t.Fatalf("after an abort: %v", got)
	}
	// Flipped: the range leaves the old owner, frozen or not.
	flipped := moving.Clone()
	flipped.Version++
	if err := flipped.Assign(b, "c", bucketmap.AssignOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := Wanted(frozen, flipped, "a"); stateAt(got, lo) != Absent {
		t.Fatalf("after the flip: %v", got)
	}
	// The target of a moving bucket never gets a freeze either.
	if got := Wanted([]Span{{Lo: lo, Hi: hi, State: Frozen, Epoch: 1}}, moving, "c"); stateAt(got, lo) != Incoming {
		t.Fatalf("target: %v", got)
	}
}

// Compare and overlay against a brute-force model over a small key space
// (keys near the bottom of int64 and near the top, to exercise the ends).
func TestSweepAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	states := []State{Owned, Frozen, Incoming}
	base := []int64{math.MinInt64, math.MaxInt64 - 40}
	gen := func() []Span {
		var out []Span
		for _, b := range base {
			k := int64(0)
			for k < 40 {
				n := int64(r.IntN(6) + 1)
				if r.IntN(3) > 0 {
					hi := min(k+n-1, 39)
					if b == math.MaxInt64-40 && hi == 39 {
						hi = 40 // reach MaxInt64
					}
					out = append(out, Span{Lo: b + k, Hi: b + hi, State: states[r.IntN(3)], Epoch: uint64(r.IntN(5))})
				}
				k += n
			}
		}
		s, err := Normalize(out)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	stateAt := func(s []Span, k int64) State {
		for _, x := range s {
			if x.Lo <= k && k <= x.Hi {
				return x.State
			}
		}
		return Absent
	}
	for range 300 {
		a, b := gen(), gen()
		ov := overlay(a, b)
		diffs := Compare(a, b)
		for _, bb := range base {
			for off := int64(0); off <= 40; off++ {
				k := bb + off
				want := stateAt(b, k)
				if want == Absent {
					want = stateAt(a, k)
				}
				if got := stateAt(ov, k); got != want {
					t.Fatalf("overlay at %d: %s, want %s\na=%v\nb=%v\nov=%v", k, got, want, a, b, ov)
				}
				inDiff := false
				for _, d := range diffs {
					if d.Lo <= k && k <= d.Hi {
						inDiff = true
						if d.Want != stateAt(a, k) || d.Got != stateAt(b, k) {
							t.Fatalf("diff at %d: %+v", k, d)
						}
					}
				}
				if inDiff != (stateAt(a, k) != stateAt(b, k)) {
					t.Fatalf("key %d: in diff %v, states %s %s", k, inDiff, stateAt(a, k), stateAt(b, k))
				}
			}
		}
		if _, err := Normalize(ov); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Normalize([]Span{{1, 5, Owned, 1}, {5, 6, Owned, 1}}); err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Fatalf("overlap accepted: %v", err)
	}
}

func TestBucketsOf(t *testing.T) {
	lo, _, _ := keystream.Range(8, 4)
	_, hi, _ := keystream.Range(8, 7)
	m, err := bucketmap.New(8, []bucketmap.Node{{ID: "n1", DSN: "postgres://h/db"}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got := BucketsOf(m, lo, hi); got != "buckets 4..7 at level 8" {
		t.Fatal(got)
	}
	if got := BucketsOf(m, lo+1, hi); !strings.Contains(got, "partly") {
		t.Fatal(got)
	}
	// At mixed depths a bucket is named with its depth.
	if err := m.SplitBucket(bucketmap.Bucket{Prefix: 5, Depth: 8}); err != nil {
		t.Fatal(err)
	}
	if got := BucketsOf(m, lo, hi); got != "buckets 4/8..7/8" {
		t.Fatal(got)
	}
	l9, h9 := bucketmap.Bucket{Prefix: 11, Depth: 9}.Keys()
	if got := BucketsOf(m, l9, h9); got != "bucket 11/9" {
		t.Fatal(got)
	}
}
