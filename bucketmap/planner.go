package bucketmap

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Policy tunes the planner.
type Policy struct {
	// Concurrency is how many moves may run at once (default 1). Never
	// more than one per source node and one per target node.
	Concurrency int
	// AutoSplit splits the map before planning while an active node would
	// own fewer than MinBucketsPerNode buckets, so that a cluster that
	// grows keeps enough buckets to balance.
	AutoSplit         bool
	MinBucketsPerNode int // default 8
	// MaxLevel caps auto-splits (default MaxLevel).
	MaxLevel int
}

func (p Policy) withDefaults() Policy {
	if p.Concurrency <= 0 {
		p.Concurrency = 1
	}
	if p.MinBucketsPerNode <= 0 {
		p.MinBucketsPerNode = 8
	}
	if p.MaxLevel <= 0 || p.MaxLevel > MaxLevel {
		p.MaxLevel = MaxLevel
	}
	return p
}

// Move is one bucket changing owner. In JSON the bucket is "bucket" and
// "level" (its depth), then "from" and "to".
type Move struct {
	Bucket
	From NodeID `json:"from"`
	To   NodeID `json:"to"`
}

// String reads "BUCKET: FROM -> TO" (without it the embedded Bucket's
// String would name the bucket alone).
func (mv Move) String() string { return fmt.Sprintf("%s: %s -> %s", mv.Bucket, mv.From, mv.To) }

// Plan is the planner's answer for one map version.
type Plan struct {
	MapVersion uint64 `json:"map_version"`
	// Splits is how many times to split the map before anything else;
	// Level is the level after them, at which the buckets below count.
	Splits int `json:"splits"`
	Level  int `json:"level"`
	// Reassign lists buckets of down nodes: their data is gone, so
	// ownership changes at once without copying.
	Reassign []Move `json:"reassign"`
	// Moves lists the copies to make, in order.
	Moves []Move `json:"moves"`
	// LowerBound is the fewest bucket changes any balanced result needs;
	// len(Reassign)+len(Moves) equals it.
	LowerBound int `json:"lower_bound"`
	// Target is every active node's bucket count once the plan is done.
	Target map[NodeID]int `json:"target"`
}

// ErrNoActiveNode means no node can take buckets.
var ErrNoActiveNode = errors.New("no active db node to own buckets")

// share is one node's weighted fair share of the buckets.
type share struct {
	floor, ceil int
	rem         int64 // remainder of buckets*weight/totalWeight, for tie-breaks
}

// shares computes every active node's fair share: buckets*w/W, as floor and
// ceil. Non-active nodes get 0.
func shares(m *Map) ([]share, int64, error) {
	var total int64
	for _, n := range m.nodes {
		if n.State == NodeActive {
			total += int64(n.Weight)
		}
	}
	if total == 0 {
		return nil, 0, ErrNoActiveNode
	}
	out := make([]share, len(m.nodes))
	for i, n := range m.nodes {
		if n.State != NodeActive {
			continue
		}
		q := int64(m.Buckets()) * int64(n.Weight)
		out[i] = share{floor: int(q / total), ceil: int(q / total), rem: q % total}
		if q%total != 0 {
			out[i].ceil++
		}
	}
	return out, total, nil
}

// targets picks each node's final count, floor or ceil of its share,
// summing to the bucket count, so that the total excess (buckets that must
// leave a node) is the smallest possible: the ceil slots go first to nodes
// that already hold at least their ceil. cur counts buckets per node.
func targets(m *Map, cur []int) ([]int, error) {
	sh, _, err := shares(m)
	if err != nil {
		return nil, err
	}
	t := make([]int, len(m.nodes))
	free := m.Buckets()
	var cands []int
	for i := range m.nodes {
		t[i] = sh[i].floor
		free -= sh[i].floor
		if sh[i].ceil > sh[i].floor {
			cands = append(cands, i)
		}
	}
	slices.SortFunc(cands, func(a, b int) int {
		ha, hb := cur[a] >= sh[a].ceil, cur[b] >= sh[b].ceil
		if ha != hb {
			if ha {
				return -1
			}
			return 1
		}
		if ha { // both hold their ceil already: the fuller first
			if c := cmp.Compare(cur[b], cur[a]); c != 0 {
				return c
			}
		} else if c := cmp.Compare(sh[b].rem, sh[a].rem); c != 0 { // largest remainder
			return c
		}
		return cmp.Compare(m.nodes[a].ID, m.nodes[b].ID)
	})
	for _, i := range cands[:free] {
		t[i]++
	}
	return t, nil
}

// PlanFor computes the moves that balance m under pol. It is a pure
// function of (map, policy): the same inputs give the same plan everywhere.
//
// Buckets already moving count as their target's and are not planned.
func PlanFor(m *Map, pol Policy) (*Plan, error) {
	pol = pol.withDefaults()
	work := m
	splits := 0
	if pol.AutoSplit {
		active := 0
		for _, n := range m.nodes {
			if n.State == NodeActive {
				active++
			}
		}
		for active > 0 && work.Buckets()/active < pol.MinBucketsPerNode && work.Level < pol.MaxLevel {
			if work == m {
				work = m.Clone()
			}
			if err := work.Split(); err != nil {
				return nil, fmt.Errorf("auto-split: %w", err)
			}
			splits++
		}
	}
	p, err := plan(work)
	if err != nil {
		return nil, err
	}
	p.MapVersion, p.Splits = m.Version, splits
	return p, nil
}

func plan(m *Map) (*Plan, error) {
	n := len(m.nodes)
	// Planned owner of each bucket: moving buckets already belong to
	// their target.
	// The planner works on units, the buckets in key order: on a map at
	// one depth unit u is bucket u.
	units := m.BucketList()
	owner := make([]int, len(units))
	movable := make([]bool, len(units))
	cur := make([]int, n)
	for u, b := range units {
		lo, _ := m.SlotsOf(b)
		o := int(m.owners[lo])
		movable[u] = true
		if bm, ok := m.meta[lo]; ok && bm.State == BucketMoving {
			o = m.index[bm.Target]
			movable[u] = false
		}
		owner[u] = o
		cur[o]++
	}
	// sib[u] is the unit of u's sibling when it is a bucket at u's
	// depth (the two halves of one parent), else -1.
	sib := make([]int, len(units))
	for u, b := range units {
		sib[u] = -1
		if b.Depth == 0 {
			continue
		}
		v := u + 1 // in key order a sibling is next to its bucket
		if b.Prefix&1 == 1 {
			v = u - 1
		}
		if v >= 0 && v < len(units) && units[v] == b.Sibling() {
			sib[u] = v
		}
	}
	t, err := targets(m, cur)
	if err != nil {
		return nil, err
	}
	excess := make([]int, n)
	deficit := make([]int, n)
	lower := 0
	for i := range n {
		excess[i] = max(0, cur[i]-t[i])
		deficit[i] = max(0, t[i]-cur[i])
		lower += excess[i]
	}
	// A node's movable buckets, lowest first.
	mine := make([][]int, n)
	for u, o := range owner {
		if movable[u] && excess[o] > 0 {
			mine[o] = append(mine[o], u)
		}
	}
	for i := range n {
		if excess[i] > len(mine[i]) {
			// Its surplus is made of buckets still moving in: the
			// planner cannot act on those until the moves finish.
			lower -= excess[i] - len(mine[i])
			excess[i] = len(mine[i])
		}
	}
	p := &Plan{Level: m.Level, LowerBound: lower, Target: map[NodeID]int{}, Reassign: []Move{}, Moves: []Move{}}
	for i, nd := range m.nodes {
		if nd.State == NodeActive {
			p.Target[nd.ID] = t[i]
		}
	}
	// cmpLoad compares the buckets-per-weight of two nodes exactly.
	cmpLoad := func(i, j int) int {
		return cmp.Compare(int64(cur[i])*int64(m.nodes[j].Weight), int64(cur[j])*int64(m.nodes[i].Weight))
	}
	// Down nodes first: their buckets have no server.
	pickSource := func() int {
		best := -1
		for i := range n {
			if excess[i] == 0 {
				continue
			}
			if best < 0 {
				best = i
				continue
			}
			bd, id := m.nodes[best].State == NodeDown, m.nodes[i].State == NodeDown
			switch {
			case id != bd:
				if id {
					best = i
				}
			case excess[i] != excess[best]:
				if excess[i] > excess[best] {
					best = i
				}
			case cmpLoad(i, best) != 0:
				if cmpLoad(i, best) > 0 {
					best = i
				}
			case m.nodes[i].ID < m.nodes[best].ID:
				best = i
			}
		}
		return best
	}
	pickTarget := func() int {
		best := -1
		for i := range n {
			if deficit[i] == 0 {
				continue
			}
			switch {
			case best < 0:
				best = i
			case deficit[i] != deficit[best]:
				if deficit[i] > deficit[best] {
					best = i
				}
			case cmpLoad(i, best) != 0:
				if cmpLoad(i, best) < 0 {
					best = i
				}
			case m.nodes[i].ID < m.nodes[best].ID:
				best = i
			}
		}
		return best
	}
	taken := make([]bool, len(units))
	for {
		s := pickSource()
		if s < 0 {
			break
		}
		d := pickTarget()
		if d < 0 {
			return nil, fmt.Errorf("planner: node %s has buckets to give but no node can take them", m.nodes[s].ID)
		}
		b := pickBucket(mine[s], taken, owner, sib, s, d)
		taken[b] = true
		owner[b] = d
		excess[s]--
		deficit[d]--
		cur[s]--
		cur[d]++
		mv := Move{Bucket: units[b], From: m.nodes[s].ID, To: m.nodes[d].ID}
		if m.nodes[s].State == NodeDown {
			p.Reassign = append(p.Reassign, mv)
		} else {
			p.Moves = append(p.Moves, mv)
		}
	}
	return p, nil
}

// pickBucket chooses which of source s's buckets goes to d. Every choice
// costs one move; among them it keeps the split structure tidy: first a
// bucket whose sibling d already owns (the pair reunites), then one whose
// sibling is elsewhere (no pair is broken), then any; lowest number first.
func pickBucket(cands []int, taken []bool, owner, sib []int, s, d int) int {
	best, bestScore := 0, 3
	for _, b := range cands {
		if taken[b] {
			continue
		}
		score := 2
		if sib[b] >= 0 {
			switch owner[sib[b]] {
			case d:
				score = 0
			case s:
				score = 2
			default:
				score = 1
			}
		}
		if score < bestScore {
			best, bestScore = b, score
			if score == 0 {
				break
			}
		}
	}
	return best
}

// Schedule returns the moves of plan that can start now, in plan order:
// at most k in flight in total (counting inFlight), and never two touching
// the same node as source or target.
func Schedule(plan []Move, inFlight []Move, k int) []Move {
	if k <= 0 {
		k = 1
	}
	busy := map[NodeID]bool{}
	running := map[Bucket]bool{}
	for _, mv := range inFlight {
		busy[mv.From], busy[mv.To] = true, true
		running[mv.Bucket] = true
	}
	var out []Move
	for _, mv := range plan {
		if len(inFlight)+len(out) >= k {
			break
		}
		if busy[mv.From] || busy[mv.To] || running[mv.Bucket] {
			continue
		}
		busy[mv.From], busy[mv.To] = true, true
		out = append(out, mv)
	}
	return out
}

// Apply performs a plan's splits, reassignments and moves on m at once, as
// if every copy had finished: for simulations and tests, and for
// reassignments that need no copy.
func (m *Map) Apply(p *Plan) error {
	for range p.Splits {
		if err := m.Split(); err != nil {
			return err
		}
	}
	for _, mv := range p.Reassign {
		if err := m.Assign(mv.Bucket, mv.To, AssignOptions{NoCopy: true, Force: true}); err != nil {
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
