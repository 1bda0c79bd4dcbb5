package bucketmap

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"time"
)

// Size is how much of the sharded tables' data one key range holds.
type Size struct {
	Rows  int64 `json:"rows"`
	Bytes int64 `json:"bytes"`
}

// Cell is the size measured in one key range, a bucket of the map or a
// part of one (a deeper prefix).
type Cell struct {
	Bucket
	Size
}

// Sizes is one measurement of the data per key range (package sizing
// takes it on the owners): disjoint cells, each a prefix, covering what
// was measured. The planner by size reads it; it knows the size of a
// bucket made of cells, and not of a part of a cell.
type Sizes struct {
	At time.Time `json:"at"`
	// MapVersion is the map the owners were read from.
	MapVersion uint64 `json:"map_version"`
	cells      []Cell // sorted by key
	sumBytes   []int64
	sumRows    []int64
}

// NewSizes sorts and checks cells: each a valid prefix, none overlapping.
func NewSizes(cells []Cell, at time.Time, mapVersion uint64) (*Sizes, error) {
	s := &Sizes{At: at, MapVersion: mapVersion, cells: slices.Clone(cells)}
	slices.SortFunc(s.cells, func(a, b Cell) int {
		alo, _ := a.Keys()
		blo, _ := b.Keys()
		return cmp.Compare(alo, blo)
	})
	s.sumBytes = make([]int64, len(s.cells)+1)
	s.sumRows = make([]int64, len(s.cells)+1)
	var prevHi int64
	for i, c := range s.cells {
		if !c.valid() {
			return nil, fmt.Errorf("size cell %s is not a bucket", c.Bucket)
		}
		if c.Rows < 0 || c.Bytes < 0 {
			return nil, fmt.Errorf("size cell %s: negative size", c.Bucket)
		}
		lo, hi := c.Keys()
		if i > 0 && lo <= prevHi {
			return nil, fmt.Errorf("size cells %s and %s overlap", s.cells[i-1].Bucket, c.Bucket)
		}
		prevHi = hi
		s.sumBytes[i+1] = s.sumBytes[i] + c.Bytes
		s.sumRows[i+1] = s.sumRows[i] + c.Rows
	}
	return s, nil
}

// Cells returns the cells in key order. Do not modify them.
func (s *Sizes) Cells() []Cell { return s.cells }

// Of returns the size of b: the sum of the cells inside it. known is false
// when b lies inside a cell, smaller than what was measured.
func (s *Sizes) Of(b Bucket) (size Size, known bool) {
	lo, hi := b.Keys()
	// The cells that overlap b are i..j-1: the first that ends at or
	// after lo, up to the first that starts after hi.
	i := sort.Search(len(s.cells), func(k int) bool {
		_, h := s.cells[k].Keys()
		return h >= lo
	})
	j := sort.Search(len(s.cells), func(k int) bool {
		l, _ := s.cells[k].Keys()
		return l > hi
	})
	// Prefixes nest or are disjoint: a cell that overlaps b and is
	// shallower holds all of b.
	if i < j && s.cells[i].Depth < b.Depth {
		return Size{}, false
	}
	return Size{Rows: s.sumRows[j] - s.sumRows[i], Bytes: s.sumBytes[j] - s.sumBytes[i]}, true
}

// Total is the size of everything measured.
func (s *Sizes) Total() Size {
	n := len(s.cells)
	return Size{Rows: s.sumRows[n], Bytes: s.sumBytes[n]}
}

// SizePolicy tunes the planner by size (PlanBySize).
type SizePolicy struct {
	// Tolerance: a node is balanced while its bytes are at most
	// (1+Tolerance) times its fair share by weight (default 0.10).
	Tolerance float64
	// Improvement is the least a move must lower the busier node's load,
	// as a fraction of its fair share (default 0.01): smaller gains are
	// not worth a copy (Citus's improvement threshold plays this part).
	Improvement float64
	// MaxDepth caps single-bucket splits (default MaxDepth).
	MaxDepth int
	// MinSplitBytes: a bucket smaller than this is never split (default
	// 0: any bucket with rows in both halves).
	MinSplitBytes int64
	// By is what is balanced: "size" (default: the live rows' bytes) or
	// "rows". "bytes", the old name of size, is read as size.
	By string
	// Hold lists buckets the plan must neither split nor move: in a
	// move's rollback window, or with a move still under way. They count
	// on their owner.
	Hold map[Bucket]bool `json:"-"`
}

func (p SizePolicy) withDefaults() SizePolicy {
	if p.Tolerance <= 0 {
		p.Tolerance = 0.10
	}
	if p.Improvement <= 0 {
		p.Improvement = 0.01
	}
	if p.MaxDepth <= 0 || p.MaxDepth > MaxDepth {
		p.MaxDepth = MaxDepth
	}
	if p.By == "" || p.By == "bytes" {
		p.By = "size"
	}
	return p
}

// SizePlan is the planner by size's answer: the buckets to split, in
// order, then the moves, at the buckets the splits make.
type SizePlan struct {
	MapVersion uint64   `json:"map_version"`
	By         string   `json:"by"`
	Tolerance  float64  `json:"tolerance"`
	Split      []Bucket `json:"split"`
	Moves      []Move   `json:"moves"`
	// Load is every node's size before and after the plan, and its fair
	// share by weight (active nodes only have one).
	Before map[NodeID]int64 `json:"before"`
	After  map[NodeID]int64 `json:"after"`
	Fair   map[NodeID]int64 `json:"fair"`
	// MaxOverFair is the largest after/fair ratio over active nodes: at
	// most 1+Tolerance when Balanced.
	MaxOverFair float64 `json:"max_over_fair"`
	Balanced    bool    `json:"balanced"`
	// Unknown is set when a split the plan needs has halves finer than
	// the measurement: split what the plan says, measure again and plan
	// again (the rebalancer does).
	Unknown []Bucket `json:"measure_again,omitempty"`
	// Stuck names buckets that would need splitting but cannot be: at
	// MaxDepth, under MinSplitBytes, or all of their rows on one side (a
	// single key, or a tenant whose keys share a longer prefix).
	Stuck []string `json:"stuck,omitempty"`
}

type sizeUnit struct {
	b      Bucket
	size   int64
	owner  int
	moving bool // in a move's write pause: counted on its target, not planned
	moved  bool // by this plan already
	// halves, once the plan splits the unit: a move planned before the
	// split moves both.
	halves []*sizeUnit
}

// leaves lists the buckets u ends as after the plan's splits.
func (u *sizeUnit) leaves(out []Bucket) []Bucket {
	if u.halves == nil {
		return append(out, u.b)
	}
	for _, h := range u.halves {
		out = h.leaves(out)
	}
	return out
}

type plannedMove struct {
	u        *sizeUnit
	from, to NodeID
}

// PlanBySize computes the splits and moves that bring every active node
// within pol.Tolerance of its fair share of sz's bytes (or rows), by
// weight; draining nodes give everything away. It is a pure function of
// (map, sizes, policy).
//
// It moves the bucket whose size best fills the gap between the busiest
// node and the emptiest, when that lowers the busiest by at least
// pol.Improvement. When no bucket of the busiest node can, it splits its
// largest splittable bucket (known halves, both with rows, above the
// floor and the depth cap) and tries again, so that a hot bucket is cut
// down as far as balance needs, not only to a node's fair share.
func PlanBySize(m *Map, sz *Sizes, pol SizePolicy) (*SizePlan, error) {
	pol = pol.withDefaults()
	of := func(b Bucket) (int64, bool) {
		s, ok := sz.Of(b)
		if pol.By == "rows" {
			return s.Rows, ok
		}
		return s.Bytes, ok
	}
	n := len(m.nodes)
	var units []*sizeUnit
	load := make([]int64, n)
	var unknown []Bucket
	m.EachBucket(func(b Bucket, lo, _ uint32) bool {
		s, ok := of(b)
		if !ok {
			unknown = append(unknown, b)
		}
		u := &sizeUnit{b: b, size: s, owner: int(m.owners[lo]), moving: pol.Hold[b]}
		if bm, ok := m.meta[lo]; ok && bm.State == BucketMoving {
			u.owner, u.moving = m.index[bm.Target], true
		}
		units = append(units, u)
		load[u.owner] += s
		return true
	})
	if len(unknown) > 0 {
		return nil, fmt.Errorf("the sizes do not cover bucket %s (and %d more): measure again", unknown[0], len(unknown)-1)
	}
	var totalW int64
	var total int64
	for i, nd := range m.nodes {
		total += load[i]
		if nd.State == NodeActive {
			totalW += int64(nd.Weight)
		}
	}
	if totalW == 0 {
		return nil, ErrNoActiveNode
	}
	fair := make([]float64, n)
	p := &SizePlan{MapVersion: m.Version, By: pol.By, Tolerance: pol.Tolerance, Split: []Bucket{}, Moves: []Move{}, Before: map[NodeID]int64{}, After: map[NodeID]int64{}, Fair: map[NodeID]int64{}}
	for i, nd := range m.nodes {
		if nd.State == NodeRemoved {
			continue
		}
		p.Before[nd.ID] = load[i]
		if nd.State == NodeActive {
			fair[i] = float64(total) * float64(nd.Weight) / float64(totalW)
			p.Fair[nd.ID] = int64(fair[i])
		}
	}
	byNode := make([][]*sizeUnit, n)
	held := make([]int, n) // units that stay where they are
	for _, u := range units {
		if !u.moving {
			byNode[u.owner] = append(byNode[u.owner], u)
		} else {
			held[u.owner]++
		}
	}
	// ratio is a node's load over its fair share; a node with no share
	// (draining, down) is over by any measure while it owns any bucket,
	// even an empty one: it must end with none.
	ratio := func(i int, l int64) float64 {
		if fair[i] == 0 {
			if l == 0 && len(byNode[i]) == 0 && held[i] == 0 {
				return 0
			}
			return 1e18
		}
		return float64(l) / fair[i]
	}
	// big is each node's load in buckets of at least Tolerance times the
	// mean fair share.
	meanFair := float64(total) / float64(max(1, len(p.Fair)))
	big := make([]int64, n)
	for _, u := range units {
		if float64(u.size) >= pol.Tolerance*meanFair {
			big[u.owner] += u.size
		}
	}
	stuck := make([]bool, n) // nothing more to do from this node
	splitDone := map[Bucket]bool{}
	var moves []plannedMove
	// Every step moves a bucket to a node left less loaded than the
	// source was, or splits one (at most MaxDepth levels each): the
	// sorted loads fall, so the loop ends; the cap only guards a bug.
	for steps := 0; steps < 64*len(units)+64*n+1024; steps++ {
		src := -1
		for i := range n {
			if stuck[i] || len(byNode[i]) == 0 {
				continue
			}
			if src < 0 || ratio(i, load[i]) > ratio(src, load[src]) {
				src = i
			}
		}
		if src < 0 || ratio(src, load[src]) <= 1+pol.Tolerance {
			break
		}
		dst := -1
		for i, nd := range m.nodes {
			if nd.State == NodeActive && i != src && (dst < 0 || ratio(i, load[i]) < ratio(dst, load[dst])) {
				dst = i
			}
		}
		if dst < 0 {
			stuck[src] = true
			continue
		}
		before := ratio(src, load[src])
		// gain is how much a move lowers the pair's higher ratio. A big
		// bucket counts on the receiver as what it will hold once its
		// small buckets have left (it sheds them in later steps).
		gain := func(u *sizeUnit, d int) float64 {
			after := ratio(d, load[d]+u.size)
			if float64(u.size) >= pol.Tolerance*meanFair {
				after = min(after, max(float64(big[d]+u.size)/fair[d], 1))
			}
			return before - max(ratio(src, load[src]-u.size), after)
		}
		// A big bucket goes where the other big ones leave most room: a
		// node's small buckets can be moved off it later, big ones
		// barely, and two on one node may fit nowhere else.
		dstFor := func(u *sizeUnit) int {
			if float64(u.size) < pol.Tolerance*meanFair {
				return dst
			}
			d := -1
			var dk [2]float64
			for i, nd := range m.nodes {
				if nd.State != NodeActive || i == src {
					continue
				}
				k := [2]float64{float64(big[i]+u.size) / fair[i], ratio(i, load[i]+u.size)}
				if d < 0 || k[0] < dk[0] || (k[0] == dk[0] && k[1] < dk[1]) {
					d, dk = i, k
				}
			}
			return d
		}
		// The bucket that gains most; ties to the lower key (units are
		// in key order per node).
		best, bestDst, bestGain := -1, -1, pol.Improvement
		if fair[src] == 0 {
			bestGain = -1e18 // a draining node gives everything away
		}
		for k, u := range byNode[src] {
			if u.moved {
				continue // once per plan: no bucket travels back and forth
			}
			d := dstFor(u)
			// A node takes only what it can hold within the tolerance
			// once its small buckets have gone elsewhere (it sheds them
			// in later steps): a bucket too big for any node is split
			// instead, as moving it whole would only move the problem. A
			// draining node's buckets go regardless.
			if fair[src] > 0 && float64(big[d]+u.size) > (1+pol.Tolerance)*fair[d] && ratio(d, load[d]+u.size) > 1+pol.Tolerance {
				continue
			}
			if g := gain(u, d); g > bestGain+1e-12 {
				best, bestDst, bestGain = k, d, g
			}
		}
		if best >= 0 {
			u, d := byNode[src][best], bestDst
			byNode[src] = slices.Delete(byNode[src], best, best+1)
			moves = append(moves, plannedMove{u, m.nodes[src].ID, m.nodes[d].ID})
			load[src] -= u.size
			load[d] += u.size
			if float64(u.size) >= pol.Tolerance*meanFair {
				big[src] -= u.size
				big[d] += u.size
			}
			u.owner, u.moved = d, true
			byNode[d] = append(byNode[d], u)
			continue
		}
		// No move helps enough: split the largest bucket that can be.
		order := slices.Clone(byNode[src])
		slices.SortStableFunc(order, func(a, b *sizeUnit) int { return cmp.Compare(b.size, a.size) })
		split := false
		for _, u := range order {
			if u.size == 0 {
				break
			}
			h0, h1 := u.b.Halves()
			s0, ok0 := of(h0)
			s1, ok1 := of(h1)
			switch {
			case u.b.Depth >= pol.MaxDepth:
				p.stuck(fmt.Sprintf("%s: at the depth cap %d", u.b, pol.MaxDepth), splitDone, u.b)
				continue
			case u.size < pol.MinSplitBytes:
				p.stuck(fmt.Sprintf("%s: %d under the split floor %d", u.b, u.size, pol.MinSplitBytes), splitDone, u.b)
				continue
			case !ok0 || !ok1:
				if !splitDone[u.b] {
					p.Unknown = append(p.Unknown, u.b)
					splitDone[u.b] = true
				}
				continue
			case s0 == 0 || s1 == 0:
				p.stuck(fmt.Sprintf("%s: every row is in half %s (one key, or keys under one longer prefix)", u.b, map[bool]Bucket{true: h0, false: h1}[s1 == 0]), splitDone, u.b)
				continue
			}
			p.Split = append(p.Split, u.b)
			u.halves = []*sizeUnit{{b: h0, size: s0, owner: src}, {b: h1, size: s1, owner: src}}
			for _, h := range append([]*sizeUnit{u}, u.halves...) {
				if float64(h.size) >= pol.Tolerance*meanFair {
					if h == u {
						big[src] -= h.size
					} else {
						big[src] += h.size
					}
				}
			}
			k := slices.Index(byNode[src], u)
			byNode[src] = slices.Replace(byNode[src], k, k+1, u.halves...)
			split = true
			break
		}
		if !split {
			stuck[src] = true
		}
	}
	// Splits run first, so a move planned before its bucket was split
	// moves each of the bucket's final parts.
	for _, mv := range moves {
		for _, b := range mv.u.leaves(nil) {
			p.Moves = append(p.Moves, Move{Bucket: b, From: mv.from, To: mv.to})
		}
	}
	p.MaxOverFair = 0
	p.Balanced = true
	for i, nd := range m.nodes {
		if nd.State == NodeRemoved {
			continue
		}
		p.After[nd.ID] = load[i]
		r := ratio(i, load[i])
		if nd.State == NodeActive {
			p.MaxOverFair = max(p.MaxOverFair, r)
		}
		if r > 1+pol.Tolerance {
			p.Balanced = false
		}
	}
	return p, nil
}

func (p *SizePlan) stuck(why string, seen map[Bucket]bool, b Bucket) {
	if !seen[b] {
		seen[b] = true
		p.Stuck = append(p.Stuck, why)
	}
}

// ApplySizePlan performs a plan's splits and moves on m at once, as if
// every copy had finished: for simulations and tests.
func (m *Map) ApplySizePlan(p *SizePlan) error {
	for _, b := range p.Split {
		if err := m.SplitBucket(b); err != nil {
			return err
		}
	}
	for _, mv := range p.Moves {
		if err := m.Assign(mv.Bucket, mv.To, AssignOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// CellsOfSlots turns per-slot sizes at level (what a GROUP BY on the
// directory slot returns) into cells, one per slot, so that an empty
// bucket has a known size of 0.
func CellsOfSlots(level int, slots map[uint32]Size) []Cell {
	out := make([]Cell, 0, 1<<level)
	for s := range uint32(1) << level {
		out = append(out, Cell{Bucket: Bucket{s, level}, Size: slots[s]})
	}
	return out
}

// Refine replaces the cells inside b with finer ones (a histogram of b at
// a deeper depth), so that the planner knows the sizes of b's parts.
func Refine(cells []Cell, b Bucket, finer []Cell) []Cell {
	out := slices.DeleteFunc(slices.Clone(cells), func(c Cell) bool { return b.Contains(c.Bucket) })
	return append(out, finer...)
}
