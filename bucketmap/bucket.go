package bucketmap

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/keystream"
)

// Bucket names one bucket of a map: the users whose keystream prefix
// starts with the Depth bits of Prefix. A map at one depth has 2^Level
// buckets, all at Depth Level; splitting one bucket (SplitBucket) gives
// a map of mixed depths, in which the buckets still tile the key space:
// every key has exactly one bucket whose prefix matches it (extendible
// hashing; docs/bucket-map.md, "Mixed depths").
//
// In JSON a bucket is its prefix and its depth, under the names move
// records and route answers already use: "bucket" and "level".
type Bucket struct {
	Prefix uint32 `json:"bucket"`
	Depth  int    `json:"level"`
}

// String names b as PREFIX/DEPTH, like a CIDR block: 5/3 is the keys
// whose first three bits are 101. Map.Name gives the shorter bare number
// on a map at one depth.
func (b Bucket) String() string { return fmt.Sprintf("%d/%d", b.Prefix, b.Depth) }

// Keys returns the inclusive key range of b (keystream.Key form).
func (b Bucket) Keys() (lo, hi int64) {
	lo, hi, err := keystream.Range(b.Depth, b.Prefix)
	if err != nil {
		panic(err) // a Bucket of a validated map is always in range
	}
	return lo, hi
}

// Halves returns the two buckets one level deeper that b splits into.
func (b Bucket) Halves() (Bucket, Bucket) {
	return Bucket{b.Prefix << 1, b.Depth + 1}, Bucket{b.Prefix<<1 | 1, b.Depth + 1}
}

// Sibling returns the other half of b's parent (b itself at depth 0).
func (b Bucket) Sibling() Bucket {
	if b.Depth == 0 {
		return b
	}
	return Bucket{b.Prefix ^ 1, b.Depth}
}

// Contains reports whether c lies inside b (or is b).
func (b Bucket) Contains(c Bucket) bool {
	return c.Depth >= b.Depth && c.Prefix>>(c.Depth-b.Depth) == b.Prefix
}

func (b Bucket) valid() bool {
	return b.Depth >= 0 && b.Depth <= MaxDepth && uint64(b.Prefix) < 1<<b.Depth
}

// Uniform reports whether every bucket is at the map's Level (the only
// shape before single-bucket splits, and what format version 1 stores).
func (m *Map) Uniform() bool { return m.depth == nil }

// Slots is the size of the map's directory, 2^Level: the owner of a key
// is the owner of directory slot "the key's first Level bits", whatever
// the depth of the bucket that covers the slot. On a map at one depth a
// slot is a bucket.
func (m *Map) Slots() int { return 1 << m.Level }

// MinDepth is the depth of the shallowest bucket (Level on a map at one
// depth); Level is the deepest.
func (m *Map) MinDepth() int {
	if m.depth == nil {
		return m.Level
	}
	d := m.Level
	for s := 0; s < len(m.depth); s += 1 << (m.Level - int(m.depth[s])) {
		d = min(d, int(m.depth[s]))
	}
	return d
}

// depthAt is the depth of the bucket that covers slot s.
func (m *Map) depthAt(s uint32) int {
	if m.depth == nil {
		return m.Level
	}
	return int(m.depth[s])
}

// SlotDepths returns the depth of the bucket that covers each slot, or nil
// on a map at one depth: the router's hot path reads it. Do not modify it.
func (m *Map) SlotDepths() []uint8 { return m.depth }

// BucketAt returns the bucket that covers directory slot s (< Slots()).
func (m *Map) BucketAt(s uint32) Bucket {
	d := m.depthAt(s)
	return Bucket{s >> (m.Level - d), d}
}

// BucketOfPrefix returns the bucket of a keystream prefix.
func (m *Map) BucketOfPrefix(p uint64) Bucket {
	return m.BucketAt(keystream.BucketOf(p, m.Level))
}

// SlotsOf returns the directory slots b covers, lo..hi inclusive. b must
// be no deeper than the map's Level.
func (m *Map) SlotsOf(b Bucket) (lo, hi uint32) {
	sh := m.Level - b.Depth
	return b.Prefix << sh, (b.Prefix+1)<<sh - 1
}

// Has reports whether b is one of the map's buckets.
func (m *Map) Has(b Bucket) bool {
	if !b.valid() || b.Depth > m.Level {
		return false
	}
	lo, _ := m.SlotsOf(b)
	return m.depthAt(lo) == b.Depth
}

// EachBucket calls fn for every bucket in key order with the slots it
// covers, until fn returns false.
func (m *Map) EachBucket(fn func(b Bucket, lo, hi uint32) bool) {
	for s := 0; s < m.Slots(); {
		b := m.BucketAt(uint32(s))
		n := 1 << (m.Level - b.Depth)
		if !fn(b, uint32(s), uint32(s+n-1)) {
			return
		}
		s += n
	}
}

// BucketList returns every bucket in key order.
func (m *Map) BucketList() []Bucket {
	out := make([]Bucket, 0, m.Buckets())
	m.EachBucket(func(b Bucket, _, _ uint32) bool {
		out = append(out, b)
		return true
	})
	return out
}

// OwnerOf returns the owner of bucket b (which must be one of the map's).
func (m *Map) OwnerOf(b Bucket) NodeID {
	lo, _ := m.SlotsOf(b)
	return m.Owner(lo)
}

// MetaOf returns bucket b's state beyond its owner.
func (m *Map) MetaOf(b Bucket) BucketMeta {
	lo, _ := m.SlotsOf(b)
	return m.Meta(lo)
}

// Name names b for people: its bare prefix on a map at one depth, as
// always, else PREFIX/DEPTH.
func (m *Map) Name(b Bucket) string {
	if m.depth == nil && b.Depth == m.Level {
		return strconv.FormatUint(uint64(b.Prefix), 10)
	}
	return b.String()
}

// AtLevel, as a Bucket's Depth, stands for the map's level: a bare bucket
// number, as named before mixed depths. Map.Resolve turns it into a
// bucket, on a map at one depth only.
const AtLevel = -1

// ParseBucket reads a bucket as operators name it, without a map:
// PREFIX/DEPTH, or a bare PREFIX whose Depth is AtLevel.
func ParseBucket(s string) (Bucket, error) {
	ps, ds, slash := strings.Cut(strings.TrimSpace(s), "/")
	p, err := strconv.ParseUint(ps, 10, 32)
	if err != nil {
		return Bucket{}, fmt.Errorf("bucket %q: %q is not a bucket number (name a bucket as NUMBER, or NUMBER/DEPTH on a map of mixed depths)", s, ps)
	}
	b := Bucket{Prefix: uint32(p), Depth: AtLevel}
	if slash {
		d, err := strconv.Atoi(ds)
		if err != nil || d < 0 || d > MaxDepth {
			return Bucket{}, fmt.Errorf("bucket %q: depth %q is not a number in 0..%d", s, ds, MaxDepth)
		}
		b.Depth = d
		if !b.valid() {
			return Bucket{}, fmt.Errorf("%w: bucket %s: at depth %d the numbers are 0..%d", ErrBucketRange, b, b.Depth, uint64(1)<<b.Depth-1)
		}
	}
	return b, nil
}

// Resolve checks that b (from ParseBucket) is one of the map's buckets,
// giving a bare number the map's level; the error says what is wrong and
// what the map has.
func (m *Map) Resolve(b Bucket) (Bucket, error) {
	if b.Depth == AtLevel {
		if m.depth != nil {
			slot := b.Prefix % uint32(m.Slots())
			return Bucket{}, hint.New(fmt.Errorf("%w: bucket %d: the map has buckets at depths %d..%d, so name one with its depth, NUMBER/DEPTH (slot %d at depth %d is in bucket %s)",
				ErrBucketRange, b.Prefix, m.MinDepth(), m.Level, slot, m.Level, m.BucketAt(slot)), "shardctl buckets lists them")
		}
		b.Depth = m.Level
	}
	return b, m.Check(b)
}

// ParseBucket is ParseBucket then Resolve.
func (m *Map) ParseBucket(s string) (Bucket, error) {
	b, err := ParseBucket(s)
	if err != nil {
		return Bucket{}, err
	}
	return m.Resolve(b)
}

// notABucket explains why b is not one of the map's buckets.
func (m *Map) notABucket(b Bucket) error {
	if m.depth == nil && b.Depth == m.Level {
		return fmt.Errorf("%w: bucket %d, the map has %d buckets (0..%d) at level %d", ErrBucketRange, b.Prefix, m.Buckets(), m.Buckets()-1, m.Level)
	}
	if !b.valid() {
		return fmt.Errorf("%w: bucket %s: at depth %d the numbers are 0..%d", ErrBucketRange, b, b.Depth, uint64(1)<<b.Depth-1)
	}
	// The bucket that holds b's first keys says whether b is split
	// further or is part of a larger bucket.
	lo, _, _ := keystream.Range(b.Depth, b.Prefix)
	c := m.BucketOfPrefix(keystream.PrefixFromKey(lo))
	if c.Depth < b.Depth {
		return fmt.Errorf("%w: bucket %s is part of bucket %s, which is not split that deep", ErrBucketRange, b, c)
	}
	return fmt.Errorf("%w: bucket %s is split further: its first half begins with bucket %s", ErrBucketRange, b, c)
}

// validateDepths checks the directory's shape: every bucket covers an
// aligned run of slots that all carry its depth and name one owner, the
// deepest bucket is at Level, and depths are listed only when they differ
// (one form per map, so that equal maps encode alike). It also recounts
// the buckets.
func (m *Map) validateDepths() error {
	if m.depth == nil {
		m.nbuckets = 1 << m.Level
		return nil
	}
	if len(m.depth) != m.Slots() {
		return fmt.Errorf("%d slot depths for %d slots (level %d)", len(m.depth), m.Slots(), m.Level)
	}
	n, deepest, shallowest := 0, 0, m.Level
	for s := 0; s < len(m.depth); {
		d := int(m.depth[s])
		if d > m.Level {
			return fmt.Errorf("slot %d: depth %d is deeper than the map's level %d", s, d, m.Level)
		}
		run := 1 << (m.Level - d)
		if s%run != 0 || s+run > len(m.depth) {
			return fmt.Errorf("slot %d: a bucket at depth %d must start at a multiple of %d slots", s, d, run)
		}
		for t := s + 1; t < s+run; t++ {
			if int(m.depth[t]) != d {
				return fmt.Errorf("bucket %s: slot %d says depth %d", Bucket{uint32(s / run), d}, t, m.depth[t])
			}
			if m.owners[t] != m.owners[s] {
				return fmt.Errorf("bucket %s: slot %d names owner index %d, slot %d names %d", Bucket{uint32(s / run), d}, s, m.owners[s], t, m.owners[t])
			}
		}
		n++
		deepest, shallowest = max(deepest, d), min(shallowest, d)
		s += run
	}
	if deepest != m.Level {
		return fmt.Errorf("the deepest bucket is at depth %d, but the map's level is %d", deepest, m.Level)
	}
	if shallowest == deepest {
		return fmt.Errorf("every bucket is at depth %d: a map at one depth lists no depths", deepest)
	}
	m.nbuckets = n
	return nil
}

// normalize drops the depths once every bucket is at Level again (edits
// keep nbuckets counted, so this costs nothing per split).
func (m *Map) normalize() {
	if m.depth != nil && m.nbuckets == m.Slots() {
		m.depth = nil
	}
}

// Check returns nil if b is one of the map's buckets, else an error
// (ErrBucketRange) saying why not: out of range, part of a shallower
// bucket, or split further.
func (m *Map) Check(b Bucket) error {
	if m.Has(b) {
		return nil
	}
	return m.notABucket(b)
}
