package bucketmap

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/shardvisor/shardvisor/hint"
)

// Edits change a Map in place; call them on a Clone (Store.Update hands its
// callback one). Store.Update sets Version and UpdatedAt of the clone to the
// new version's before the callback runs, so history entries carry the
// version that ends an ownership.

// ErrUnknownNode means a node id is not in the registry.
var ErrUnknownNode = errors.New("unknown db node")

// ErrBucketRange means a bucket number is out of range for the level.
var ErrBucketRange = errors.New("bucket out of range")

// New builds the first map (version 1) of a cluster: the buckets are dealt
// out in contiguous runs, in node order, by weight, so the initial layout
// is as tidy as the split structure allows.
func New(level int, nodes []Node, at time.Time) (*Map, error) {
	if level < 0 || level > MaxLevel {
		return nil, fmt.Errorf("level %d out of range 0..%d", level, MaxLevel)
	}
	if len(nodes) == 0 {
		return nil, errors.New("a cluster needs at least one db node")
	}
	m := &Map{Version: 1, Level: level, UpdatedAt: at, index: map[NodeID]int{}, meta: map[uint32]BucketMeta{}}
	for _, n := range nodes {
		if n.State == "" {
			n.State = NodeActive
		}
		if n.Weight == 0 {
			n.Weight = 1
		}
		if err := m.AddNode(n); err != nil {
			return nil, err
		}
	}
	cur := make([]int, len(m.nodes))
	t, err := targets(m, cur)
	if err != nil {
		return nil, err
	}
	m.owners = make([]uint16, m.Slots())
	b := 0
	for i, k := range t {
		for range k {
			m.owners[b] = uint16(i)
			b++
		}
	}
	return m, m.Validate()
}

func (m *Map) mustIndex(id NodeID) (int, error) {
	i, ok := m.index[id]
	if !ok {
		return 0, fmt.Errorf("%w %q", ErrUnknownNode, id)
	}
	return i, nil
}

func (m *Map) checkBucket(b Bucket) (lo, hi uint32, err error) {
	if !m.Has(b) {
		return 0, 0, m.notABucket(b)
	}
	lo, hi = m.SlotsOf(b)
	return lo, hi, nil
}

// AddNode adds a db node to the registry. It owns nothing until the
// planner gives it buckets.
func (m *Map) AddNode(n Node) error {
	if n.State == "" {
		n.State = NodeActive
	}
	if n.Weight == 0 {
		n.Weight = 1
	}
	if err := ValidateNode(n); err != nil {
		return err
	}
	if _, dup := m.index[n.ID]; dup {
		return fmt.Errorf("node %s is already in the registry", n.ID)
	}
	if len(m.nodes) >= MaxNodes {
		return fmt.Errorf("the registry is full (%d nodes)", MaxNodes)
	}
	m.index[n.ID] = len(m.nodes)
	m.nodes = append(m.nodes, n)
	return nil
}

// SetWeight changes a node's relative capacity.
func (m *Map) SetWeight(id NodeID, w int) error {
	i, err := m.mustIndex(id)
	if err != nil {
		return err
	}
	if w < 1 || w > MaxWeight {
		return fmt.Errorf("weight %d out of range 1..%d", w, MaxWeight)
	}
	m.nodes[i].Weight = w
	return nil
}

// SetConnection changes how a node is reached, to c's DSN, pool DSN,
// password reference, stream user and Patroni group. It is how a plain node becomes a group
// (its server turned into a Patroni primary with standbys) or a group's
// member list changes. Ownership does not change: the data is where it
// was, only the way to its primary is new.
func (m *Map) SetConnection(id NodeID, c Node) error {
	i, err := m.mustIndex(id)
	if err != nil {
		return err
	}
	n := m.nodes[i]
	n.DSN, n.PoolDSN, n.Password, n.StreamUser, n.Patroni = c.DSN, c.PoolDSN, c.Password, c.StreamUser, c.Patroni
	if err := ValidateNode(n); err != nil {
		return err
	}
	m.nodes[i] = n
	return nil
}

// Drain marks a node draining: it keeps its buckets until the planner's
// moves take them away.
func (m *Map) Drain(id NodeID) error {
	i, err := m.mustIndex(id)
	if err != nil {
		return err
	}
	if s := m.nodes[i].State; s != NodeActive && s != NodeDraining {
		return fmt.Errorf("node %s is %s; only an active node can drain", id, s)
	}
	m.nodes[i].State = NodeDraining
	return nil
}

// Activate makes a draining or down node active again (a down node comes
// back empty: its buckets were reassigned when it went down).
func (m *Map) Activate(id NodeID) error {
	i, err := m.mustIndex(id)
	if err != nil {
		return err
	}
	if m.nodes[i].State == NodeRemoved {
		return fmt.Errorf("node %s was removed; add it again instead", id)
	}
	m.nodes[i].State = NodeActive
	return nil
}

// MarkDown marks a node down and at once reassigns its buckets, spread by
// weight across the active nodes, without copying (their data is gone, so
// they are marked DataLost). Moves to or from the node are cancelled.
func (m *Map) MarkDown(id NodeID) ([]Move, error) {
	i, err := m.mustIndex(id)
	if err != nil {
		return nil, err
	}
	if m.nodes[i].State == NodeRemoved {
		return nil, fmt.Errorf("node %s was removed", id)
	}
	prev := m.nodes[i].State
	m.nodes[i].State = NodeDown
	for b, bm := range m.meta {
		if bm.State == BucketMoving && (bm.Target == id || int(m.owners[b]) == i) {
			m.setMeta(b, BucketMeta{DataLost: bm.DataLost})
		}
	}
	p, err := plan(m)
	if err != nil {
		m.nodes[i].State = prev
		if errors.Is(err, ErrNoActiveNode) {
			return nil, fmt.Errorf("cannot mark %s down: %w to take its buckets", id, err)
		}
		return nil, err
	}
	for _, mv := range p.Reassign {
		if err := m.Assign(mv.Bucket, mv.To, AssignOptions{NoCopy: true, Force: true}); err != nil {
			return nil, err
		}
	}
	return p.Reassign, nil
}

// RemoveNode takes a node out of service for good. It must own no bucket
// and be no move's target. It stays in the registry as removed while the
// history mentions it (GC still needs to know where its old rows are), and
// is dropped once it does not.
func (m *Map) RemoveNode(id NodeID) error {
	i, err := m.mustIndex(id)
	if err != nil {
		return err
	}
	if owned := m.Counts()[id]; owned > 0 {
		return hint.New(fmt.Errorf("node %s still owns %d buckets; drain it first", id, owned), fmt.Sprintf("shardctl node drain %s, then shardctl rebalance", id))
	}
	for s, bm := range m.meta {
		if bm.State == BucketMoving && bm.Target == id {
			return fmt.Errorf("node %s is the target of the move of bucket %s", id, m.Name(m.BucketAt(s)))
		}
	}
	m.nodes[i].State = NodeRemoved
	m.compact()
	return nil
}

// compact drops removed nodes that no history entry mentions, renumbering
// the owner indexes.
func (m *Map) compact() {
	used := map[NodeID]bool{}
	for _, h := range m.history {
		used[h.Node] = true
	}
	keep := make([]Node, 0, len(m.nodes))
	renum := make([]uint16, len(m.nodes))
	for i, n := range m.nodes {
		if n.State == NodeRemoved && !used[n.ID] {
			continue
		}
		renum[i] = uint16(len(keep))
		keep = append(keep, n)
	}
	if len(keep) == len(m.nodes) {
		return
	}
	for b, o := range m.owners {
		m.owners[b] = renum[o]
	}
	m.nodes = keep
	m.index = make(map[NodeID]int, len(keep))
	for i, n := range keep {
		m.index[n.ID] = i
	}
}

// AssignOptions qualify Assign.
type AssignOptions struct {
	// NoCopy says the rows were not copied to the new owner; the bucket is
	// marked DataLost.
	NoCopy bool
	// Force allows reassigning a bucket that is moving (cancelling the
	// move) and a target that is not active.
	Force bool
}

// Assign makes to the owner of bucket b. The previous owner goes into the
// bucket's history with this map version and UpdatedAt, for GC.
func (m *Map) Assign(b Bucket, to NodeID, opt AssignOptions) error {
	lo, hi, err := m.checkBucket(b)
	if err != nil {
		return err
	}
	ti, err := m.mustIndex(to)
	if err != nil {
		return err
	}
	from := m.owners[lo]
	if int(from) == ti {
		return fmt.Errorf("bucket %s is already owned by %s", m.Name(b), to)
	}
	bm := m.meta[lo]
	if bm.State == BucketMoving && !opt.Force && bm.Target != to {
		return fmt.Errorf("bucket %s is moving to %s (move %s); use --force to override", m.Name(b), bm.Target, bm.Move)
	}
	if s := m.nodes[ti].State; s != NodeActive && (!opt.Force || s == NodeRemoved) {
		return fmt.Errorf("node %s is %s; buckets go only to active nodes", to, s)
	}
	m.history = append(m.history, Handoff{Lo: lo, Hi: hi, Node: m.nodes[from].ID, UntilVersion: m.Version, At: m.UpdatedAt})
	m.forget(to, lo, hi)
	for s := lo; s <= hi; s++ {
		m.owners[s] = uint16(ti)
	}
	m.setMeta(lo, BucketMeta{DataLost: bm.DataLost || opt.NoCopy})
	return nil
}

// forget removes slots lo..hi from node's history: it owns them again, so
// GC must not treat its rows there as leftovers.
func (m *Map) forget(node NodeID, lo, hi uint32) {
	out := m.history[:0:0]
	for _, h := range m.history {
		if h.Node != node || hi < h.Lo || lo > h.Hi {
			out = append(out, h)
			continue
		}
		if h.Lo < lo {
			l := h
			l.Hi = lo - 1
			out = append(out, l)
		}
		if hi < h.Hi {
			r := h
			r.Lo = hi + 1
			out = append(out, r)
		}
	}
	m.history = out
}

func (m *Map) setMeta(s uint32, bm BucketMeta) {
	if bm.State == "" {
		bm.State = BucketActive
	}
	if bm.plain() {
		delete(m.meta, s)
		return
	}
	m.meta[s] = bm
}

// SetMoving marks bucket b as moving to target: its move has begun its
// fence step (the write pause follows, once the mover freezes the source).
func (m *Map) SetMoving(b Bucket, target NodeID, moveID string) error {
	lo, _, err := m.checkBucket(b)
	if err != nil {
		return err
	}
	ti, err := m.mustIndex(target)
	if err != nil {
		return err
	}
	if int(m.owners[lo]) == ti {
		return fmt.Errorf("bucket %s is already owned by %s", m.Name(b), target)
	}
	if m.nodes[ti].State != NodeActive {
		return fmt.Errorf("node %s is %s; buckets move only to active nodes", target, m.nodes[ti].State)
	}
	bm := m.meta[lo]
	if bm.State == BucketMoving && bm.Move != moveID {
		return fmt.Errorf("bucket %s is already moving to %s (move %s)", m.Name(b), bm.Target, bm.Move)
	}
	if moveID == "" {
		return errors.New("a move needs an id")
	}
	m.setMeta(lo, BucketMeta{State: BucketMoving, Target: target, Move: moveID, Since: m.Version, DataLost: bm.DataLost})
	return nil
}

// ClearMoving ends bucket b's write pause without changing its owner (an
// aborted move).
func (m *Map) ClearMoving(b Bucket) error {
	lo, _, err := m.checkBucket(b)
	if err != nil {
		return err
	}
	bm := m.meta[lo]
	m.setMeta(lo, BucketMeta{DataLost: bm.DataLost})
	return nil
}

// Split doubles the bucket count: every bucket becomes its two halves one
// level deeper, with the same owner, flags and history, so every user
// stays on the same node and no data moves. On a map at one depth bucket
// k becomes 2k and 2k+1. It refuses while a bucket is moving.
func (m *Map) Split() error {
	if m.depth == nil && m.Level >= MaxLevel {
		return fmt.Errorf("level %d is the maximum; cannot split", MaxLevel)
	}
	if m.Level >= MaxDepth {
		return fmt.Errorf("the deepest bucket is at depth %d, the maximum; cannot split every bucket", MaxDepth)
	}
	for s, bm := range m.meta {
		if bm.State == BucketMoving {
			return fmt.Errorf("bucket %s is moving to %s; finish or abort its move before splitting", m.Name(m.BucketAt(s)), bm.Target)
		}
	}
	n := m.Buckets()
	m.deepen()
	for s := range m.depth {
		m.depth[s]++
	}
	m.nbuckets = 2 * n
	// Each half of a bucket keeps its flags: the first half's are at
	// the doubled slot already, the second half starts half a run on.
	for s, bm := range maps.Clone(m.meta) {
		_, hi := m.SlotsOf(m.BucketAt(s))
		m.meta[hi+1] = bm
	}
	m.normalize()
	return nil
}

// deepen doubles the directory (Level+1) without changing any bucket:
// every slot becomes two with its owner and depth, and the slot numbers
// kept in state and history double.
func (m *Map) deepen() {
	owners := make([]uint16, 2*len(m.owners))
	for s, o := range m.owners {
		owners[2*s], owners[2*s+1] = o, o
	}
	if m.depth != nil {
		depth := make([]uint8, 2*len(m.depth))
		for s, d := range m.depth {
			depth[2*s], depth[2*s+1] = d, d
		}
		m.depth = depth
	} else {
		// Every bucket stays at the old level, now one shallower than
		// the directory.
		m.depth = make([]uint8, len(owners))
		for s := range m.depth {
			m.depth[s] = uint8(m.Level)
		}
	}
	meta := make(map[uint32]BucketMeta, len(m.meta))
	for s, bm := range m.meta {
		meta[2*s] = bm
	}
	for i := range m.history {
		m.history[i].Lo, m.history[i].Hi = 2*m.history[i].Lo, 2*m.history[i].Hi+1
	}
	m.owners, m.meta = owners, meta
	m.Level++
}

// SplitBucket splits bucket b alone into its two halves one level deeper
// (Bucket.Halves), both on b's owner with b's flags and history, so that
// no data moves and either half can then move on its own. Every other
// bucket is unchanged. It refuses while b is moving, and at MaxDepth.
func (m *Map) SplitBucket(b Bucket) error {
	lo, _, err := m.checkBucket(b)
	if err != nil {
		return err
	}
	if bm := m.meta[lo]; bm.State == BucketMoving {
		return fmt.Errorf("bucket %s is moving to %s (move %s); finish or abort its move before splitting it", m.Name(b), bm.Target, bm.Move)
	}
	if b.Depth >= MaxDepth {
		return fmt.Errorf("bucket %s is at depth %d, the maximum; cannot split it", m.Name(b), MaxDepth)
	}
	n := m.Buckets()
	if lvl := max(m.Level, b.Depth+1); lvl > MaxLevel && n+1 == 1<<lvl {
		// Every bucket at one depth deeper than a map at one depth may
		// be: that map could not be stored.
		return fmt.Errorf("splitting bucket %s would leave every bucket at depth %d, deeper than the %d a map at one depth may have", m.Name(b), lvl, MaxLevel)
	}
	if b.Depth == m.Level {
		m.deepen()
	}
	lo, hi := m.SlotsOf(b)
	if m.depth == nil {
		m.depth = make([]uint8, m.Slots())
		for s := range m.depth {
			m.depth[s] = uint8(m.Level)
		}
	}
	for s := lo; s <= hi; s++ {
		m.depth[s] = uint8(b.Depth + 1)
	}
	if bm, ok := m.meta[lo]; ok {
		m.meta[lo+(hi-lo+1)/2] = bm
	}
	m.nbuckets = n + 1
	m.normalize()
	return nil
}

// PruneHistory drops the handoffs for which done returns true (GC calls it
// once a range is cleaned) and then drops removed nodes nothing mentions.
func (m *Map) PruneHistory(done func(Handoff) bool) int {
	before := len(m.history)
	m.history = slices.DeleteFunc(m.history, done)
	m.compact()
	return before - len(m.history)
}

// RestoreOwnership gives m the buckets of from, a map of an earlier
// version (a restore point's): its level, depths, owners and history,
// with every bucket active (a move in flight then is not resumed by a
// restore: its bucket stays with its source). m keeps its node registry
// (the servers' addresses now) and its version; every node from names
// must be in it. The caller bumps the version as for any edit.
func (m *Map) RestoreOwnership(from *Map) error {
	owners := make([]uint16, len(from.owners))
	for s, o := range from.owners {
		id := from.nodes[o].ID
		i, ok := m.index[id]
		if !ok {
			return fmt.Errorf("%w: %s, which owned slot %d at map version %d (add it back first: shardctl node add)", ErrUnknownNode, id, s, from.Version)
		}
		if st := m.nodes[i].State; st == NodeRemoved || st == NodeDown {
			return fmt.Errorf("node %s is %s now, and owned slot %d at map version %d: make it active first (shardctl node up %s, with its recovered server)", id, st, s, from.Version, id)
		}
		owners[s] = uint16(i)
	}
	m.Level = from.Level
	m.owners = owners
	m.depth = nil
	if from.depth != nil {
		m.depth = append([]uint8(nil), from.depth...)
	}
	m.nbuckets = from.nbuckets
	m.meta = map[uint32]BucketMeta{}
	for s, bm := range from.meta {
		bm.State, bm.Target, bm.Move, bm.Since = BucketActive, "", "", 0
		if !bm.plain() {
			m.meta[s] = bm
		}
	}
	// A handoff naming a node no longer registered has nothing left to
	// prune: GC could not reach it.
	m.history = m.history[:0:0]
	for _, h := range from.history {
		if _, ok := m.index[h.Node]; ok {
			m.history = append(m.history, h)
		}
	}
	return nil
}
