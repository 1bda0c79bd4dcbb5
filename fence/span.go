package fence

import (
	"fmt"
	"math"
	"slices"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/keystream"
)

// State is the fence state of a key range on one node. A range with no row
// in the ownership table is not owned: writes to it are rejected.
type State string

const (
	// Owned ranges accept application writes.
	Owned State = "owned"
	// Frozen ranges are in the write pause of a move away from this node:
	// application writes are rejected (reads still work).
	Frozen State = "frozen"
	// Incoming ranges are a move's target while rows are copied in:
	// application writes are rejected, logical-replication apply (which runs
	// with session_replication_role = replica) is not affected.
	Incoming State = "incoming"
	// Absent is no row: not owned. It is never stored.
	Absent State = ""
)

func (s State) valid() bool { return s == Owned || s == Frozen || s == Incoming }

// String prints Absent as "absent".
func (s State) String() string {
	if s == Absent {
		return "absent"
	}
	return string(s)
}

// Span is one row of the ownership table: the inclusive key range Lo..Hi
// (keys as stored in the bucket key column, keystream.Key) in State since
// map version Epoch.
type Span struct {
	Lo    int64  `json:"lo"`
	Hi    int64  `json:"hi"`
	State State  `json:"state"`
	Epoch uint64 `json:"epoch"`
}

func (s Span) String() string {
	return fmt.Sprintf("%d..%d %s@%d", s.Lo, s.Hi, s.State.String(), s.Epoch)
}

// LockLevel is the bucket level of the advisory locks that drain writers:
// the key space is cut into 2^LockLevel lock granules, whatever the map's
// level, so a lock's identity never changes when the map splits. A writer
// takes its granule's lock shared; a flip takes, exclusively, the granules
// that cover the flipped range: one granule for a bucket at level >=
// LockLevel (also pausing, for the few milliseconds of the flip, writers to
// the other buckets of that granule), 2^(LockLevel-n) for a bucket at level
// n < LockLevel.
const LockLevel = 10

// LockClass is the first key of the two-key advisory locks the fence takes
// (pg_advisory_xact_lock_shared(LockClass, granule)): "SV" and the lock
// level. Applications must not use this class for their own advisory locks.
const LockClass int32 = 0x5356_0000 + LockLevel

// Granule returns the lock granule of a key: its bucket at LockLevel.
func Granule(key int64) int32 {
	return int32(keystream.BucketOf(keystream.PrefixFromKey(key), LockLevel))
}

// granules returns the lock granules covering lo..hi, ascending.
func granules(lo, hi int64) []int32 {
	var out []int32
	for g := Granule(lo); g <= Granule(hi); g++ {
		out = append(out, g)
	}
	return out
}

// Desired is the fence a node should have for map m, as far as the map
// alone says: its buckets as owned (a bucket whose move has begun too: see
// Wanted for its freeze) and the buckets it is the target of a moving
// bucket for as incoming, merged into as few spans as possible, with epoch
// m.Version.
func Desired(m *bucketmap.Map, node bucketmap.NodeID) []Span {
	return desiredOf(planned(m, node), m.Version)
}

// desiredOf is Desired from the planned spans: a bucket moving away is
// owned.
func desiredOf(plan []plannedSpan, version uint64) []Span {
	var out []Span
	for _, s := range plan {
		st := s.state
		if st == Frozen {
			st = Owned
		}
		out = appendMerged(out, Span{Lo: s.lo, Hi: s.hi, State: st, Epoch: version})
	}
	return out
}

// Wanted is the fence a node with fence spans cur should have for map m:
// Desired, over the incoming ranges of cur that it does not contradict (a
// mover marks its target incoming while copying, before the map says
// anything), and with the ranges of cur that are frozen kept frozen where
// m says their bucket is moving away from this node.
//
// A moving bucket is written on its owner until its mover freezes it, so
// a map that says moving cannot say frozen: the mover first waits, up to
// its member wait, for the routers and supervisors to apply that map, and
// a freeze made from the map would refuse every write meanwhile, unseen by
// the move's recorded pause. But once the mover has frozen the range,
// nobody but the move may thaw it: writes accepted after the freeze's
// barrier marker would not reach the target.
func Wanted(cur []Span, m *bucketmap.Map, node bucketmap.NodeID) []Span {
	plan := planned(m, node)
	want := overlay(Only(cur, Incoming), desiredOf(plan, m.Version))
	var leaving []Span
	for _, s := range plan {
		if s.state == Frozen {
			leaving = appendMerged(leaving, Span{Lo: s.lo, Hi: s.hi, State: Frozen})
		}
	}
	var keep []Span
	frozen := Only(cur, Frozen)
	for _, g := range sweep(frozen, leaving) {
		if g.A >= 0 && g.B >= 0 {
			keep = appendMerged(keep, Span{Lo: g.Lo, Hi: g.Hi, State: Frozen, Epoch: frozen[g.A].Epoch})
		}
	}
	return overlay(want, keep)
}

// plannedSpan is one bucket's range and what the map makes of it on a
// node: Owned, Frozen (owned, moving away), Incoming (moving here).
type plannedSpan struct {
	lo, hi int64
	state  State
}

// planned lists, in key order, the buckets of m that node owns or is a
// move's target for.
func planned(m *bucketmap.Map, node bucketmap.NodeID) []plannedSpan {
	var out []plannedSpan
	moving := map[bucketmap.Bucket]bucketmap.BucketMeta{}
	for _, b := range m.NonActive() {
		if bm := m.MetaOf(b); bm.State == bucketmap.BucketMoving {
			moving[b] = bm
		}
	}
	nodes := m.Nodes()
	self := -1
	for i, n := range nodes {
		if n.ID == node {
			self = i
		}
	}
	// Buckets in key order, whatever their depths: each is one key range.
	m.EachBucket(func(b bucketmap.Bucket, slot, _ uint32) bool {
		var st State
		bm, isMoving := moving[b]
		switch {
		case m.OwnerIndex(slot) == self && isMoving:
			st = Frozen
		case m.OwnerIndex(slot) == self:
			st = Owned
		case isMoving && bm.Target == node:
			st = Incoming
		default:
			return true
		}
		lo, hi := b.Keys()
		out = append(out, plannedSpan{lo: lo, hi: hi, state: st})
		return true
	})
	return out
}

// appendMerged appends s, merging it into the last span when they touch and
// have the same state (the merged span keeps the larger epoch).
func appendMerged(out []Span, s Span) []Span {
	if n := len(out); n > 0 {
		last := &out[n-1]
		if last.State == s.State && last.Hi != math.MaxInt64 && last.Hi+1 == s.Lo {
			last.Hi = s.Hi
			last.Epoch = max(last.Epoch, s.Epoch)
			return out
		}
	}
	return append(out, s)
}

// Normalize sorts spans, checks that they are disjoint and valid, and
// merges neighbours with the same state.
func Normalize(spans []Span) ([]Span, error) {
	s := slices.Clone(spans)
	slices.SortFunc(s, func(a, b Span) int {
		switch {
		case a.Lo < b.Lo:
			return -1
		case a.Lo > b.Lo:
			return 1
		}
		return 0
	})
	var out []Span
	for i, x := range s {
		if x.Lo > x.Hi {
			return nil, fmt.Errorf("span %v: lo > hi", x)
		}
		if !x.State.valid() {
			return nil, fmt.Errorf("span %v: state %q is not owned, frozen or incoming", x, x.State)
		}
		if i > 0 && s[i-1].Hi >= x.Lo {
			return nil, fmt.Errorf("spans %v and %v overlap", s[i-1], x)
		}
		out = appendMerged(out, x)
	}
	return out, nil
}

// segment is a maximal key range over which two span lists each have one
// span (or none: index -1).
type segment struct {
	Lo, Hi int64
	A, B   int
}

// sweep cuts the union of two sorted, disjoint span lists into segments at
// every boundary of either, merging neighbouring segments that fall in the
// same pair of spans.
func sweep(a, b []Span) []segment {
	var pts []int64
	for _, l := range [][]Span{a, b} {
		for _, s := range l {
			pts = append(pts, s.Lo)
			if s.Hi != math.MaxInt64 {
				pts = append(pts, s.Hi+1)
			}
		}
	}
	slices.Sort(pts)
	pts = slices.Compact(pts)
	var out []segment
	ai, bi := 0, 0
	at := func(l []Span, i *int, p int64) int {
		for *i < len(l) && l[*i].Hi < p {
			*i++
		}
		if *i < len(l) && l[*i].Lo <= p {
			return *i
		}
		return -1
	}
	for k, p := range pts {
		hi := int64(math.MaxInt64)
		if k+1 < len(pts) {
			hi = pts[k+1] - 1
		}
		seg := segment{Lo: p, Hi: hi, A: at(a, &ai, p), B: at(b, &bi, p)}
		if seg.A < 0 && seg.B < 0 {
			continue
		}
		if n := len(out); n > 0 && out[n-1].A == seg.A && out[n-1].B == seg.B && out[n-1].Hi+1 == seg.Lo {
			out[n-1].Hi = seg.Hi
			continue
		}
		out = append(out, seg)
	}
	return out
}

// overlay returns top where top has a span and base elsewhere, merged.
func overlay(base, top []Span) []Span {
	var out []Span
	for _, g := range sweep(base, top) {
		src := base
		i := g.A
		if g.B >= 0 {
			src, i = top, g.B
		}
		s := src[i]
		out = appendMerged(out, Span{Lo: g.Lo, Hi: g.Hi, State: s.State, Epoch: s.Epoch})
	}
	return out
}

// Difference is a key range over which two fences disagree.
type Difference struct {
	Lo   int64 `json:"lo"`
	Hi   int64 `json:"hi"`
	Want State `json:"want"`
	Got  State `json:"got"`
}

// Compare lists the key ranges where got's state differs from want's
// (absent counts as a state), merged, in key order.
func Compare(want, got []Span) []Difference {
	var out []Difference
	for _, g := range sweep(want, got) {
		var w, h State
		if g.A >= 0 {
			w = want[g.A].State
		}
		if g.B >= 0 {
			h = got[g.B].State
		}
		if w == h {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Want == w && out[n-1].Got == h && out[n-1].Hi+1 == g.Lo {
			out[n-1].Hi = g.Hi
			continue
		}
		out = append(out, Difference{Lo: g.Lo, Hi: g.Hi, Want: w, Got: h})
	}
	return out
}

// Only returns the spans of one state.
func Only(spans []Span, st State) []Span {
	var out []Span
	for _, s := range spans {
		if s.State == st {
			out = append(out, s)
		}
	}
	return out
}

// BucketsOf describes a key range as m's buckets: "bucket 5" or
// "buckets 4..7 at level 3" (at mixed depths "buckets 0/3..1/2"), with a
// note when the range does not fall on bucket boundaries.
func BucketsOf(m *bucketmap.Map, lo, hi int64) string {
	blo := m.BucketOfPrefix(keystream.PrefixFromKey(lo))
	bhi := m.BucketOfPrefix(keystream.PrefixFromKey(hi))
	s := fmt.Sprintf("buckets %s..%s", m.Name(blo), m.Name(bhi))
	if blo == bhi {
		s = fmt.Sprintf("bucket %s", m.Name(blo))
	}
	l, _ := blo.Keys()
	_, h := bhi.Keys()
	if l != lo || h != hi {
		s += fmt.Sprintf(" (partly: keys %d..%d)", lo, hi)
	}
	if m.Uniform() {
		s += fmt.Sprintf(" at level %d", m.Level)
	}
	return s
}
