// Package gc deletes, from each db node, the rows of buckets the node no
// longer owns: the leftovers of moves and reassignments, found in the
// bucket map's history.
//
// Safety before speed. A range is deleted from node X only if
//
//   - the map's history says X owned it until some version and the map now
//     says another node, the owner Y, owns every bucket of it (a range X
//     owns again, or that is in a move's write pause, is skipped);
//   - the ownership change is older than the grace period;
//   - no move is in flight over it: no bucket of it is moving in the map,
//     and no record under moves/ names an overlapping bucket;
//   - every live router and supervisor has applied the map version at
//     which X stopped owning it (a straggler still routing by an older map
//     may read it on X), and every member record can be read; a record an
//     earlier run of this GC saw and that has vanished since counts, at its
//     last version, for one session timeout (GC.Seen);
//   - X's fence does not claim it (owned, frozen or incoming), and Y's fence
//     says Y owns all of it;
//   - Y answers, and for every sharded table holds at least MinOwnerRatio
//     (default 1) times as many rows in the range as X's leftovers.
//
// Anything else is skipped and reported, never deleted. Deletes run on X in
// batches (in key order, or in the table's page order for rows spread over
// it; see delete.go), each its own short transaction with
// session_replication_role = replica (which bypasses the fence trigger),
// holding the range's lock granules shared and re-checking X's fence, so a
// move towards X that starts meanwhile (it marks X incoming first) stops
// GC. A run is stateless: rows once deleted stay deleted, and a run killed
// half-way is resumed by the next run, which recomputes what is left. When
// a history entry's range is clean on its node, the entry is pruned from
// the map by compare-and-swap.
package gc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Options tune a run.
type Options struct {
	// Grace: an ownership change must be at least this old (default 1h;
	// negative means zero).
	Grace time.Duration
	// Batch is about how many rows one delete transaction removes (default 20000).
	Batch int
	// Order forces the batches' walk order: OrderKey or OrderHeap. Empty
	// (OrderAuto) chooses per table by sampling where the range's rows sit.
	Order string
	// Parallel is how many connections delete on a node at once, each
	// running its own batch transactions over its share of the walk
	// (default 2; 1 deletes batch after batch on one connection). Rate caps
	// them together.
	Parallel int
	// Rate caps deletes, in rows per second over the run (0: no cap).
	Rate float64
	// DryRun checks and counts everything but deletes and prunes nothing.
	DryRun bool
	// Node limits the run to one node's leftovers.
	Node bucketmap.NodeID
	// MinOwnerRatio: the owner must hold at least this many times the
	// leftover rows of a range, per table (default 1; 0 keeps the default;
	// negative means any number, even none).
	MinOwnerRatio float64
	// Connect opens a connection to a node (default dbnode.Connect).
	Connect func(ctx context.Context, n bucketmap.Node) (*pgx.Conn, error)
	// Progress is called after every batch (and once per range before it
	// starts), one call at a time, from whichever goroutine ran the batch.
	Progress func(Progress)
	// Metrics, if set, is updated as the run goes.
	Metrics *Metrics
	Logger  *zap.Logger
	Now     func() time.Time
}

func (o *Options) defaults() {
	if o.Grace == 0 {
		o.Grace = time.Hour
	}
	if o.Grace < 0 {
		o.Grace = 0
	}
	if o.Batch <= 0 {
		o.Batch = 20000
	}
	if o.Parallel <= 0 {
		o.Parallel = 2
	}
	if o.MinOwnerRatio == 0 {
		o.MinOwnerRatio = 1
	}
	if o.Connect == nil {
		o.Connect = dbnode.Connect
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Batch walk orders (see delete.go).
const (
	OrderAuto = ""
	OrderKey  = "key"
	OrderHeap = "heap"
)

// Skip kinds. Uncertain ones make a run fail (exit 1): something needs a
// person. The others are expected and resolve themselves.
const (
	SkipGrace        = "grace"            // the change is too recent
	SkipMove         = "move-in-flight"   // a move involves the range
	SkipOwnedAgain   = "owned-again"      // the node owns the bucket again
	SkipNodeDown     = "node-unreachable" // the node with the leftovers does not answer: nothing can be deleted
	SkipOwnerDown    = "owner-unreachable"
	SkipOwnerRows    = "owner-rows"    // the owner holds too few of the range's rows
	SkipFence        = "fence"         // a fence disagrees with the map
	SkipMoveRecord   = "move-record"   // an unreadable move record blocks everything
	SkipTableMissing = "table-missing" // a sharded table is missing on the owner
	// SkipMemberBehind: a live router or supervisor has not applied the map
	// version that took the range from the node (or its record cannot be
	// read), so its clients may still read the range there.
	SkipMemberBehind = "member-behind"
	// SkipMemberVanished: the only members behind are ones whose records
	// an earlier run saw and that have vanished since (their hosts may
	// still serve from their last map until their sessions are shown
	// ended). Not uncertain: it resolves within one session timeout.
	SkipMemberVanished = "member-vanished"
	// SkipGroup: the node or the owner is a Patroni group without a
	// leader or without a synchronous standby: a failover there may lose
	// rows (or is under way), so the leftover copy stays until the group
	// is whole again.
	SkipGroup = "group-not-safe"
)

var uncertain = map[string]bool{SkipNodeDown: true, SkipOwnerDown: true, SkipOwnerRows: true, SkipFence: true, SkipMoveRecord: true, SkipTableMissing: true,
	// Past the grace period a member that far behind is stuck: a person
	// should look.
	SkipMemberBehind: true, SkipGroup: true}

// Range is a bucket range of one history entry, on one node.
type Range struct {
	Node    bucketmap.NodeID `json:"node"`
	Owner   bucketmap.NodeID `json:"owner,omitempty"`
	Level   int              `json:"level"`
	Lo      uint32           `json:"bucket_lo"`
	Hi      uint32           `json:"bucket_hi"`
	KeyLo   int64            `json:"key_lo"`
	KeyHi   int64            `json:"key_hi"`
	Since   time.Time        `json:"changed_at"`
	Version uint64           `json:"until_map_version"`
	handoff bucketmap.Handoff
}

func (r Range) String() string {
	b := fmt.Sprintf("buckets %d..%d", r.Lo, r.Hi)
	if r.Lo == r.Hi {
		b = fmt.Sprintf("bucket %d", r.Lo)
	}
	return fmt.Sprintf("%s at level %d on %s", b, r.Level, r.Node)
}

// TableWork is one table's rows in a range.
type TableWork struct {
	Table     string `json:"table"`
	Rows      int64  `json:"rows"`       // leftover rows on the node
	OwnerRows int64  `json:"owner_rows"` // rows of the range on the owner
	Deleted   int64  `json:"deleted"`
	// Order is how the batches walk the rows: "key" (consecutive key
	// sub-ranges, through the key index) or "heap" (consecutive runs of
	// table pages, for rows spread all over the table); see delete.go.
	Order string `json:"order,omitempty"`
}

// Work is a range GC deletes (or, dry, would delete).
type Work struct {
	Range
	Tables []TableWork `json:"tables"`
	Done   bool        `json:"done"` // every leftover row deleted
}

// Skip is a range GC left alone, and why.
type Skip struct {
	Range
	Kind      string `json:"kind"`
	Reason    string `json:"reason"`
	Uncertain bool   `json:"uncertain"`
}

// Report is what a run found and did.
type Report struct {
	MapVersion uint64        `json:"map_version"`
	Level      int           `json:"level"`
	DryRun     bool          `json:"dry_run"`
	Work       []Work        `json:"ranges"`
	Skipped    []Skip        `json:"skipped"`
	Rows       int64         `json:"rows"` // leftover rows found in deletable ranges
	Deleted    int64         `json:"deleted"`
	Batches    int           `json:"batches"`
	MaxBatch   time.Duration `json:"-"`
	MaxBatchMS float64       `json:"max_batch_ms"`
	Elapsed    time.Duration `json:"-"`
	ElapsedS   float64       `json:"elapsed_s"`
	// Where the time went: finding and checking ranges (map, fences,
	// counts on both nodes), inside delete transactions, pruning.
	Checking time.Duration `json:"-"`
	// Connecting is the part of Checking spent opening one connection to
	// each node, all at once (the deletes use them too).
	Connecting  time.Duration `json:"-"`
	ConnectingS float64       `json:"connecting_s"`
	Deleting    time.Duration `json:"-"`
	CheckingS   float64       `json:"checking_s"`
	DeletingS   float64       `json:"deleting_s"`
	Pruned      int           `json:"history_pruned"`
	PruneErrors []string      `json:"prune_errors,omitempty"`
}

// Uncertain counts the skips that need a person.
func (r *Report) Uncertain() int {
	n := 0
	for _, s := range r.Skipped {
		if s.Uncertain {
			n++
		}
	}
	return n
}

// Progress is reported after every batch: the one shape of progress
// callback, as migrate.Progress is migrate's.
type Progress struct {
	// Message is the line, e.g. "pg1 app.kv [0x00, 0x40): 1200 of 5000
	// rows deleted, 12 batches".
	Message  string
	Node     bucketmap.NodeID
	Table    string
	Range    string
	Deleted  int64 // in the whole run so far
	Total    int64 // rows the run means to delete
	Batches  int
	Elapsed  time.Duration
	MaxBatch time.Duration
}

// GC is one cluster's garbage collector.
type GC struct {
	Session *zksession.Session
	Store   *bucketmap.Store
	Tables  []topo.TableRecord
	Opt     Options

	// Seen remembers the member records earlier runs read, so that one
	// that has vanished since still counts, at its last map version, until
	// one session timeout has passed (fleet.Remembered); Run starts one when
	// nil. A GC with no earlier run (a one-shot shardctl gc) cannot know
	// what vanished before it looked: it counts the records it reads, and
	// nothing more. Keep one GC, or hand Seen on, across periodic runs.
	Seen *fleet.Remembered

	segments map[string]int // history entry -> how many ranges it was cut into
}

// ErrNoTables means the cluster has no sharded tables, so nothing for GC.
var ErrNoTables = hint.New(errors.New("gc: the cluster has no sharded tables"), "shardctl table add")

// New returns the GC of the cluster of st with the cluster's sharded
// tables, refusing a cluster without any (ErrNoTables) and an opt.Node
// that is not in the registry (bucketmap.ErrUnknownNode; checked when the
// map can be read, and if it cannot, Run says so).
func New(ctx context.Context, st *bucketmap.Store, opt Options) (*GC, error) {
	rec, err := topo.ReadCluster(ctx, st.Session(), st.Paths())
	if err != nil {
		return nil, err
	}
	if len(rec.Tables) == 0 {
		return nil, ErrNoTables
	}
	if opt.Node != "" {
		if m, _, err := st.Load(ctx); err == nil {
			if _, ok := m.Node(opt.Node); !ok {
				return nil, fmt.Errorf("%w %q", bucketmap.ErrUnknownNode, opt.Node)
			}
		}
	}
	return &GC{Session: st.Session(), Store: st, Tables: rec.Tables, Opt: opt}, nil
}

func hkey(h bucketmap.Handoff) string {
	return fmt.Sprintf("%s/%d/%d/%d", h.Node, h.Lo, h.Hi, h.UntilVersion)
}

// Run finds the leftovers, checks them, and (unless DryRun) deletes them
// and prunes the history entries that are clean. It takes the cluster's GC
// lock for the run (ErrLocked when another GC holds it) and stops, with the
// context's error, if the lock is lost: the next run resumes. An error
// means the run could not proceed at all; skipped ranges are in the report.
func (g *GC) Run(ctx context.Context) (*Report, error) {
	g.Opt.defaults()
	switch g.Opt.Order {
	case OrderAuto, OrderKey, OrderHeap:
	default:
		return nil, fmt.Errorf("gc: unknown batch order %q (want %q, %q or empty for automatic)", g.Opt.Order, OrderKey, OrderHeap)
	}
	lock, err := Acquire(ctx, g.Session, g.Store.Paths())
	if err != nil {
		return nil, err
	}
	defer lock.Release(context.WithoutCancel(ctx))
	ctx, cancel := lock.l.Context(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(context.Cause(ctx), zksession.ErrLockLost) {
			g.Opt.Logger.Error("gc: ZooKeeper session lost; stopping (the next run resumes)")
		}
	})
	defer stop()
	return g.run(ctx)
}

func (g *GC) run(ctx context.Context) (*Report, error) {
	start := g.Opt.Now()
	m, _, err := g.Store.Load(ctx)
	if err != nil {
		return nil, err
	}
	moves, err := ReadMoves(ctx, g.Session, g.Store.Paths())
	if err != nil {
		return nil, err
	}
	members, err := g.readMembers(ctx)
	if err != nil {
		return nil, err
	}
	rep := &Report{MapVersion: m.Version, Level: m.Level, DryRun: g.Opt.DryRun, Work: []Work{}, Skipped: []Skip{}}
	g.segments = map[string]int{}
	cands := g.candidates(m, moves, members, rep)
	cands = g.checkGroups(ctx, m, cands, rep)

	conns := &connCache{connect: g.Opt.Connect, m: m, conns: map[bucketmap.NodeID]*pgx.Conn{}, errs: map[bucketmap.NodeID]error{}}
	defer conns.close()
	// Every node at once: connect; then, again all at once, read its
	// fence and count every range it holds leftovers of or owns, in one
	// round trip (readNode). Then the checks.
	t0 := g.Opt.Now()
	conns.dial(ctx, cands)
	rep.Connecting = g.Opt.Now().Sub(t0)
	counts := g.readNodes(ctx, conns, cands)
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	var work []Work
	for _, r := range cands {
		if skip := g.verifyFences(ctx, conns, r); skip != nil {
			rep.Skipped = append(rep.Skipped, *skip)
			continue
		}
		w, skip := g.verifyCounts(r, counts)
		if skip != nil {
			rep.Skipped = append(rep.Skipped, *skip)
			continue
		}
		for _, t := range w.Tables {
			rep.Rows += t.Rows
		}
		work = append(work, w)
	}
	for _, s := range rep.Skipped {
		g.Opt.Logger.Info("gc: skipped", zap.String("range", s.Range.String()), zap.String("kind", s.Kind), zap.String("reason", s.Reason))
		g.Opt.Metrics.skipped(s.Kind)
	}
	if g.Opt.DryRun {
		rep.Work = work
		rep.Checking = g.Opt.Now().Sub(start)
		rep.Elapsed = g.Opt.Now().Sub(start)
		rep.finish()
		return rep, nil
	}
	g.Opt.Metrics.remaining(rep.Rows)
	rep.Checking = g.Opt.Now().Sub(start)
	d := &deleter{g: g, rep: rep, start: start, conns: conns}
	defer d.close()
	var runErr error
	for i := range work {
		if err := d.delete(ctx, &work[i]); err != nil {
			runErr = err
			break
		}
	}
	rep.Work = work
	if runErr == nil {
		g.prune(ctx, rep, work)
	}
	rep.Elapsed = g.Opt.Now().Sub(start)
	rep.finish()
	return rep, runErr
}

// readMembers reads the live member records, and adds those an earlier
// run saw that have vanished since, for the grace: this session's timeout
// (a live owner re-creates its record well within it; a session that could
// not has expired by then).
func (g *GC) readMembers(ctx context.Context) ([]fleet.Applied, error) {
	read, err := fleet.ReadApplied(ctx, g.Session, g.Store.Paths())
	if err != nil {
		return nil, err
	}
	if g.Seen == nil {
		g.Seen = &fleet.Remembered{}
	}
	return g.Seen.Pass(read, g.Opt.Now(), g.Session.SessionTimeout()), nil
}

// checkGroups keeps out the ranges whose node or owner is a Patroni group
// that is not whole now (no leader, or no synchronous standby in
// synchronous mode): deleting the leftover copy is safe only while the
// owner's copy survives its next failover. A group's records that cannot
// be read count as not whole.
func (g *GC) checkGroups(ctx context.Context, m *bucketmap.Map, cands []Range, rep *Report) []Range {
	verdict := map[bucketmap.NodeID]string{}
	unsafe := func(id bucketmap.NodeID) string {
		if v, ok := verdict[id]; ok {
			return v
		}
		n, ok := m.Node(id)
		v := ""
		if ok && !n.Patroni.IsZero() {
			grp, err := topo.ReadPatroni(ctx, g.Session, n.Patroni.Namespace, n.Patroni.Scope)
			if err != nil {
				v = "its Patroni records cannot be read: " + err.Error()
			} else {
				v = grp.Unsafe()
			}
		}
		verdict[id] = v
		return v
	}
	var keep []Range
	for _, r := range cands {
		why, who := unsafe(r.Owner), r.Owner
		if why == "" {
			why, who = unsafe(r.Node), r.Node
		}
		if why != "" {
			rep.Skipped = append(rep.Skipped, Skip{Range: r, Kind: SkipGroup, Reason: fmt.Sprintf("%s is a Patroni group and %s", who, why), Uncertain: true})
			continue
		}
		keep = append(keep, r)
	}
	return keep
}

func (r *Report) finish() {
	r.MaxBatchMS = float64(r.MaxBatch.Microseconds()) / 1000
	r.ElapsedS = r.Elapsed.Seconds()
	r.CheckingS = r.Checking.Seconds()
	r.ConnectingS = r.Connecting.Seconds()
	r.DeletingS = r.Deleting.Seconds()
}

// candidates cuts the history into ranges with one owner each and skips
// those the map alone rules out.
func (g *GC) candidates(m *bucketmap.Map, moves []MoveRange, members []fleet.Applied, rep *Report) []Range {
	now := g.Opt.Now()
	var out []Range
	for _, h := range m.History() {
		if g.Opt.Node != "" && h.Node != g.Opt.Node {
			continue
		}
		type cls struct {
			owner bucketmap.NodeID
			kind  string
			why   string
		}
		classify := func(b uint32) cls {
			owner := m.Owner(b)
			if owner == h.Node {
				return cls{kind: SkipOwnedAgain, why: fmt.Sprintf("%s owns it again", h.Node)}
			}
			if bm := m.Meta(b); bm.State == bucketmap.BucketMoving {
				return cls{owner: owner, kind: SkipMove, why: fmt.Sprintf("in the write pause of move %s to %s", bm.Move, bm.Target)}
			}
			return cls{owner: owner}
		}
		var segs []Range
		var kinds []cls
		for b := h.Lo; ; b++ {
			c := classify(b)
			lo, hi, _ := keystream.Range(m.Level, b)
			if n := len(segs); n > 0 && kinds[n-1] == c {
				segs[n-1].Hi, segs[n-1].KeyHi = b, hi
			} else {
				segs = append(segs, Range{Node: h.Node, Owner: c.owner, Level: m.Level, Lo: b, Hi: b, KeyLo: lo, KeyHi: hi, Since: h.At, Version: h.UntilVersion, handoff: h})
				kinds = append(kinds, c)
			}
			if b == h.Hi {
				break
			}
		}
		g.segments[hkey(h)] = len(segs)
		for i, s := range segs {
			skip := func(kind, why string) {
				rep.Skipped = append(rep.Skipped, Skip{Range: s, Kind: kind, Reason: why, Uncertain: uncertain[kind]})
			}
			if kinds[i].kind != "" {
				skip(kinds[i].kind, kinds[i].why)
				continue
			}
			if eligible := h.At.Add(g.Opt.Grace); now.Before(eligible) {
				skip(SkipGrace, fmt.Sprintf("ownership changed at %s (map version %d); eligible after %s", h.At.Format(time.RFC3339), h.UntilVersion, eligible.Format(time.RFC3339)))
				continue
			}
			if mv, ok := overlapping(moves, s.KeyLo, s.KeyHi); ok {
				if mv.All {
					skip(SkipMoveRecord, mv.Why+"; GC deletes nothing while it is there")
				} else {
					skip(SkipMove, fmt.Sprintf("move %s of bucket %d at level %d is in flight", mv.ID, mv.Bucket, mv.Level))
				}
				continue
			}
			if why := fleet.DescribeBehind(members, h.UntilVersion); why != "" {
				kind := SkipMemberVanished
				if slices.ContainsFunc(members, func(m fleet.Applied) bool { return m.Gone == nil && m.Behind(h.UntilVersion) }) {
					kind = SkipMemberBehind
				}
				skip(kind, why+fmt.Sprintf(", at which %s stopped owning it: its clients may still read the range there", h.Node))
				continue
			}
			out = append(out, s)
		}
	}
	return out
}

func overlapping(moves []MoveRange, lo, hi int64) (MoveRange, bool) {
	for _, mv := range moves {
		if mv.Lo <= hi && lo <= mv.Hi {
			return mv, true
		}
	}
	return MoveRange{}, false
}

// prune drops the history entries whose whole range was deleted clean.
func (g *GC) prune(ctx context.Context, rep *Report, work []Work) {
	var done []bucketmap.Handoff
	clean := map[string]int{}
	for _, w := range work {
		if w.Done {
			k := hkey(w.handoff)
			if clean[k]++; clean[k] == g.segments[k] {
				done = append(done, w.handoff)
			}
		}
	}
	if len(done) == 0 {
		return
	}
	m, err := g.Store.Update(ctx, func(m *bucketmap.Map) error {
		n := m.PruneHistory(func(h bucketmap.Handoff) bool {
			return slices.ContainsFunc(done, func(d bucketmap.Handoff) bool {
				return d.Lo == h.Lo && d.Hi == h.Hi && d.Node == h.Node && d.UntilVersion == h.UntilVersion
			})
		})
		rep.Pruned = n
		if n == 0 {
			return errNothingToPrune
		}
		return nil
	})
	switch {
	case errors.Is(err, errNothingToPrune):
		rep.Pruned = 0
	case err != nil:
		rep.Pruned = 0
		rep.PruneErrors = append(rep.PruneErrors, err.Error())
		g.Opt.Logger.Warn("gc: pruning the history failed; the next run retries", zap.Error(err))
	default:
		g.Opt.Logger.Info("gc: pruned history", zap.Int("entries", rep.Pruned), zap.Uint64("map_version", m.Version))
	}
}

var errNothingToPrune = errors.New("nothing to prune")
