package migrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/ownership"
	"github.com/shardvisor/shardvisor/sizing"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Reasons the rebalancer stops by itself.
var (
	ErrPaused    = errors.New("rebalancer is paused")
	ErrNodeDown  = errors.New("a db node is down")
	ErrSuspended = errors.New("ZooKeeper session is not connected")
	// ErrWaitingForMoves: every planned move touches a bucket or a node of
	// an unfinished move, which the orphan watcher is finishing.
	ErrWaitingForMoves = errors.New("waiting for unfinished moves")
)

// Rebalancer executes the planner's moves until the map is balanced.
type Rebalancer struct {
	mv  *Mover
	pol bucketmap.Policy
	log *zap.Logger
	// Attempts is how many times a move that aborted cleanly (a node that
	// did not answer in time, say) is tried before the rebalancer stops.
	// Default 3.
	Attempts int
	// Backoff is the wait before the first retry; it doubles, with ±20%
	// jitter (internal/backoff). Default 2 s.
	Backoff time.Duration
	// Progress, when set, receives a line per decision (Move is nil).
	Progress func(Progress)
	// BySize, when set, balances what the nodes hold (RunBySize) instead
	// of bucket counts; Sizing tunes the measurements it takes.
	BySize *bucketmap.SizePolicy
	Sizing sizing.Options
	// BeforeChanges, when set, runs once per Run before its first split
	// or move (a restore point: package backup, through the command); its
	// error stops the run before anything changed.
	BeforeChanges func(ctx context.Context) error
	// watcherRuns: RunForever's orphan watcher owns unfinished moves.
	watcherRuns bool
	// changing: BeforeChanges ran in this Run.
	changing bool
}

// beforeChanges runs BeforeChanges once per Run.
func (rb *Rebalancer) beforeChanges(ctx context.Context) error {
	if rb.changing || rb.BeforeChanges == nil {
		return nil
	}
	if err := rb.BeforeChanges(ctx); err != nil {
		return err
	}
	rb.changing = true
	return nil
}

// windowHint says how to end the rollback windows a rebalance waits for.
const windowHint = "shardctl moves lists them; shardctl move complete ID ends one"

// unfinished returns the moves not finished (failed ones included: their
// nodes and bucket need a person first) at m's level, as in-flight moves
// for the scheduler.
func (rb *Rebalancer) unfinished(ctx context.Context, m *bucketmap.Map) ([]bucketmap.Move, error) {
	list, err := rb.mv.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []bucketmap.Move
	for _, r := range list {
		// A move in its rollback window has moved its bucket.
		if !r.Finished() && r.State != topo.MoveReversible && m.Has(recBucket(r)) {
			out = append(out, bucketmap.Move{Bucket: recBucket(r), From: bucketmap.NodeID(r.Source), To: bucketmap.NodeID(r.Target)})
		}
	}
	return out, nil
}

// inWindow returns the buckets of m whose move is in its rollback window.
func (rb *Rebalancer) inWindow(ctx context.Context, m *bucketmap.Map) (map[bucketmap.Bucket]bool, error) {
	list, err := InWindow(ctx, rb.mv.st)
	if err != nil {
		return nil, err
	}
	held := map[bucketmap.Bucket]bool{}
	for _, r := range list {
		if m.Has(recBucket(r)) {
			held[recBucket(r)] = true
		}
	}
	return held, nil
}

// ErrBalanceMode: a rebalance by count was asked of a cluster that
// balances by size.
var ErrBalanceMode = errors.New("balance mode")

// InWindow lists the moves in their rollback window (reversible or
// completing). A split waits for them: the rollback of a bucket the map
// has split cannot run.
func InWindow(ctx context.Context, st *bucketmap.Store) ([]*topo.MoveRecord, error) {
	return unfinished(ctx, st, func(rec *topo.MoveRecord) bool {
		return rec.State == topo.MoveReversible || rec.State == topo.MoveCompleting
	})
}

// MovesOf lists the unfinished moves of b's keys: of b itself, or of a
// bucket it was split from or into.
func MovesOf(ctx context.Context, st *bucketmap.Store, b bucketmap.Bucket) ([]*topo.MoveRecord, error) {
	return unfinished(ctx, st, func(rec *topo.MoveRecord) bool {
		rb := recBucket(rec)
		return rb.Contains(b) || b.Contains(rb)
	})
}

// MovesUsing lists the unfinished moves whose source or target is node: a
// node they still need (a move past its flip drops its slot there, one in
// its window rolls back to it) is not to be removed from the registry.
func MovesUsing(ctx context.Context, st *bucketmap.Store, node bucketmap.NodeID) ([]*topo.MoveRecord, error) {
	return unfinished(ctx, st, func(rec *topo.MoveRecord) bool {
		return rec.Source == string(node) || rec.Target == string(node)
	})
}

func unfinished(ctx context.Context, st *bucketmap.Store, keep func(*topo.MoveRecord) bool) ([]*topo.MoveRecord, error) {
	ids, err := topo.ListMoves(ctx, st.Session(), st.Paths())
	if err != nil {
		return nil, err
	}
	var out []*topo.MoveRecord
	for _, id := range ids {
		rec, _, err := topo.ReadMove(ctx, st.Session(), st.Paths(), id)
		if errors.Is(err, zksession.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if !rec.Finished() && keep(rec) {
			out = append(out, rec)
		}
	}
	return out, nil
}

// NewRebalancer returns a rebalancer that runs moves with mv.
func NewRebalancer(mv *Mover, pol bucketmap.Policy) *Rebalancer {
	return &Rebalancer{mv: mv, pol: pol, log: mv.log.With(zap.String("component", "rebalancer")), Attempts: 3, Backoff: 2 * time.Second}
}

// Report is what one Run did.
type Report struct {
	Splits int `json:"splits"`
	// Reassigned is always 0; the field stays for the report's format.
	// Buckets of a down node are reassigned, without copying and with the
	// fence sync, when the node is marked down (ownership.Changer.NodeDown
	// via `shardctl node down`), and the rebalancer refuses to run while a node
	// is down (ErrNodeDown), so it never has any to reassign itself.
	Reassigned int                `json:"reassigned"`
	Resumed    []string           `json:"resumed,omitempty"`
	Moves      []*topo.MoveRecord `json:"moves"`
	Balanced   bool               `json:"balanced"`
	// Phases is where the moves' time went (SummarizePhases), once
	// balanced.
	Phases []PhaseStat `json:"phases,omitempty"`
	// By size only: the buckets split, the last plan's largest
	// size/fair-share ratio, and why it stopped short of the tolerance.
	SplitBuckets []bucketmap.Bucket `json:"split_buckets,omitempty"`
	MaxOverFair  float64            `json:"max_over_fair,omitempty"`
	Stuck        []string           `json:"stuck,omitempty"`
	// MaxOverFairRows and MaxOverFairBytes are the last measurement's
	// largest owned/fair ratios in rows and live bytes (OverFair): what
	// the nodes hold once GC has run. Measured is that measurement.
	MaxOverFairRows  float64             `json:"max_over_fair_rows,omitempty"`
	MaxOverFairBytes float64             `json:"max_over_fair_bytes,omitempty"`
	Measured         []sizing.NodeReport `json:"measured,omitempty"`
}

func (rb *Rebalancer) say(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	rb.log.Info(msg)
	if rb.Progress != nil {
		rb.Progress(Progress{Message: msg})
	}
}

// State reads the rebalancer's record (nil: never paused).
func (rb *Rebalancer) State(ctx context.Context) (*topo.RebalanceRecord, error) {
	return topo.ReadRebalance(ctx, rb.mv.s, rb.mv.p)
}

// Resume clears a pause.
func (rb *Rebalancer) Resume(ctx context.Context) error {
	rec, err := modeOf(ctx, rb.mv)
	if err != nil {
		return err
	}
	rec.At = time.Now().UTC()
	return topo.WriteRebalance(ctx, rb.mv.s, rb.mv.p, rec)
}

// BalanceMode is what the cluster balances: topo.BalanceCount,
// BalanceSize or BalanceRows (see topo.RebalanceRecord.By).
func (rb *Rebalancer) BalanceMode(ctx context.Context) (string, error) {
	rec, err := rb.State(ctx)
	return rec.Mode(), err
}

// SetBalanceMode records what the cluster balances from now on (a
// running `rebalance --watch` follows it, and logs the change), and who
// set it: by names the command or person. A pause stays as it was. It
// returns the mode it replaced; setting the mode it has changes nothing.
func (rb *Rebalancer) SetBalanceMode(ctx context.Context, mode, by string) (old string, err error) {
	mode, err = topo.ParseBalanceMode(mode)
	if err != nil {
		return "", err
	}
	rec, err := rb.State(ctx)
	if err != nil {
		return "", err
	}
	old = rec.Mode()
	if rec == nil {
		rec = &topo.RebalanceRecord{Version: topo.RebalanceVersion, At: time.Now().UTC()}
	}
	if old == mode && rec.By != "bytes" {
		return old, nil
	}
	now := time.Now().UTC()
	rec.By, rec.BySetBy, rec.BySetAt = mode, by, &now
	if err := topo.WriteRebalance(ctx, rb.mv.s, rb.mv.p, *rec); err != nil {
		return old, err
	}
	rb.log.Info("balance mode set", zap.String("old", old), zap.String("new", mode), zap.String("set_by", by))
	return old, nil
}

// DescribeMode says what the cluster balances by rec, who set it and
// when, in one line for status and the watcher's log.
func DescribeMode(rec *topo.RebalanceRecord) string {
	s := "balances by " + rec.Mode()
	if rec != nil && rec.BySetAt != nil {
		s += fmt.Sprintf(" (set by %s at %s)", rec.BySetBy, rec.BySetAt.Format(time.RFC3339))
	} else if rec.Mode() != topo.BalanceCount {
		s += " (who set it was not recorded)"
	}
	return s
}

// ModeHint names the command that sets the other modes from mode.
func ModeHint(mode string) string {
	if mode == topo.BalanceCount {
		return "`shardctl rebalance mode size` balances by size instead"
	}
	return "`shardctl rebalance mode count` balances bucket counts again"
}

// Pause stops the rebalancer until Resume.
func (rb *Rebalancer) Pause(ctx context.Context, reason string) error {
	return rb.mv.pause(ctx, reason, "")
}

// check refuses to go on when it is not safe to move data.
func (rb *Rebalancer) check(ctx context.Context, m *bucketmap.Map) error {
	if st := rb.mv.s.State(); st != zksession.StateConnected {
		return fmt.Errorf("%w (%s)", ErrSuspended, st)
	}
	if rec, err := rb.State(ctx); err != nil {
		return err
	} else if rec != nil && rec.Paused {
		return hint.New(fmt.Errorf("%w since %s: %s", ErrPaused, rec.At.Format(time.RFC3339), rec.Reason), "shardctl rebalance --resume, once it is understood")
	}
	for _, n := range m.Nodes() {
		if n.State == bucketmap.NodeDown {
			return hint.New(fmt.Errorf("%w: %s", ErrNodeDown, n.ID),
				fmt.Sprintf("bring it back with `shardctl node up %s` or retire it with `shardctl node remove %s`", n.ID, n.ID))
		}
	}
	return nil
}

// Plan is the planner's answer for the live map.
func (rb *Rebalancer) Plan(ctx context.Context) (*bucketmap.Plan, error) {
	m, _, err := rb.mv.st.Load(ctx)
	if err != nil {
		return nil, err
	}
	return bucketmap.PlanFor(m, rb.pol)
}

// Run moves buckets until the planner has nothing left to do, or stops on
// the first problem: a failed move, a verification mismatch (which also
// pauses it), a node down, ZooKeeper not connected.
func (rb *Rebalancer) Run(ctx context.Context) (*Report, error) {
	rep := &Report{Moves: []*topo.MoveRecord{}}
	retry := map[bucketmap.Bucket]*backoff.Backoff{} // per bucket, after clean aborts
	rb.changing = false
	// Unfinished moves first: a mover that died left them. Under
	// RunForever the orphan watcher owns them: plan around them instead.
	moves, err := rb.mv.List(ctx)
	if err != nil {
		return rep, err
	}
	for _, r := range moves {
		if r.Finished() || r.State == topo.MoveFailed || rb.watcherRuns {
			continue
		}
		rb.say("resuming unfinished move %s (bucket %d, %s -> %s, %s)", r.ID, r.Bucket, r.Source, r.Target, r.State)
		rec, err := rb.mv.Resume(ctx, r.ID)
		rep.Resumed = append(rep.Resumed, r.ID)
		if err != nil && !errors.Is(err, ErrBusy) && (rec == nil || rec.State != topo.MoveAborted) {
			return rep, err
		}
	}
	if rb.BySize != nil {
		return rep, rb.runBySize(ctx, rep, retry)
	}
	// A cluster balanced by size is not rebalanced by count: that would
	// undo it (a hot bucket's halves count like any bucket). The watcher
	// says so when it sees the mode change (lead), not on every run.
	if by, err := rb.BalanceMode(ctx); err != nil {
		return rep, err
	} else if by != topo.BalanceCount {
		if rb.watcherRuns {
			return rep, nil
		}
		return rep, hint.New(fmt.Errorf("%w: the cluster balances by %s", ErrBalanceMode, by),
			fmt.Sprintf("shardctl rebalance --by %s; %s", by, ModeHint(by)))
	}
	for {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		m, _, err := rb.mv.st.Load(ctx)
		if err != nil {
			return rep, err
		}
		if err := rb.check(ctx, m); err != nil {
			return rep, err
		}
		p, err := bucketmap.PlanFor(m, rb.pol)
		if err != nil {
			return rep, err
		}
		// A bucket in a move's rollback window cannot move again until
		// that move completes or rolls back: plan around it, and split
		// only once no move is in its window (the rollback of a bucket
		// the map has split cannot run).
		held, err := rb.inWindow(ctx, m)
		if err != nil {
			return rep, err
		}
		if p.Splits > 0 && len(held) > 0 {
			return rep, hint.New(fmt.Errorf("%w: a split to level %d waits for %d moves in their rollback window", ErrWaitingForMoves, p.Level, len(held)), windowHint)
		}
		if p.Splits > 0 {
			if err := rb.beforeChanges(ctx); err != nil {
				return rep, err
			}
			rb.say("splitting %d time(s) to level %d before moving", p.Splits, p.Level)
			// Through ownership, like every map change outside a move: the
			// fences follow the split (drift is logged as a warning, for
			// the reconciler; it does not stop the rebalancer).
			if _, err := ownership.New(rb.mv.st, ownership.Options{Logger: rb.log}).Split(ctx, p.Splits); err != nil {
				return rep, err
			}
			rep.Splits += p.Splits
			continue
		}
		planned := len(p.Moves)
		p.Moves = slices.DeleteFunc(p.Moves, func(mv bucketmap.Move) bool { return held[mv.Bucket] })
		if len(p.Moves) == 0 && planned > 0 {
			return rep, hint.New(fmt.Errorf("%w: %d planned moves wait for buckets in a move's rollback window", ErrWaitingForMoves, planned), windowHint)
		}
		// p.Reassign is empty here: it lists buckets of down nodes, and
		// check refused to go on while a node is down (see
		// Report.Reassigned).
		if len(p.Moves) == 0 {
			rep.Balanced = true
			rb.say("balanced: nothing to move")
			if rep.Phases = SummarizePhases(rep.Moves); len(rep.Phases) > 0 {
				rb.say("where the moves' time went: %s", DescribeSummary(rep.Phases))
			}
			return rep, nil
		}
		if err := rb.beforeChanges(ctx); err != nil {
			return rep, err
		}
		var inFlight []bucketmap.Move
		if rb.watcherRuns {
			if inFlight, err = rb.unfinished(ctx, m); err != nil {
				return rep, err
			}
		}
		batch := bucketmap.Schedule(p.Moves, inFlight, rb.pol.Concurrency)
		if len(batch) == 0 {
			return rep, fmt.Errorf("%w: %d unfinished, %d planned", ErrWaitingForMoves, len(inFlight), len(p.Moves))
		}
		rb.say("%d moves left (lower bound %d); starting %d", len(p.Moves), p.LowerBound, len(batch))
		if err := rb.runBatch(ctx, rep, batch, retry); err != nil {
			return rep, err
		}
	}
}

// runBatch runs a batch of moves at once and puts every one in the report
// before an error stops the run (a move left half done must show in it).
// A move that aborted cleanly left nothing behind: after a pause it is
// planned again, up to Attempts times, before the run gives up.
func (rb *Rebalancer) runBatch(ctx context.Context, rep *Report, batch []bucketmap.Move, retry map[bucketmap.Bucket]*backoff.Backoff) error {
	var wg sync.WaitGroup
	results := make([]*topo.MoveRecord, len(batch))
	errs := make([]error, len(batch))
	for i, mv := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = rb.mv.MoveBucket(ctx, mv.Bucket, mv.To, false)
		}()
	}
	wg.Wait()
	for _, rec := range results {
		if rec != nil {
			rep.Moves = append(rep.Moves, rec)
			switch rec.State {
			case topo.MoveDone:
				rb.say("%s", movedLine(rec))
			case topo.MoveReversible:
				rb.say("%s; rollback window open (move %s)", movedLine(rec), rec.ID)
			case topo.MoveRolledBack:
				rb.say("move of bucket %s %s -> %s rolled back: %s", recBucket(rec), rec.Source, rec.Target, rec.Error)
			}
		}
	}
	for i, rec := range results {
		if errs[i] == nil {
			continue
		}
		if rec != nil && rec.State == topo.MoveAborted && !errors.Is(errs[i], ErrVerifyMismatch) {
			b := retry[recBucket(rec)]
			if b == nil {
				b = backoff.New(rb.Backoff, rb.Backoff<<rb.Attempts)
				retry[recBucket(rec)] = b
			}
			if failures := b.Attempts() + 1; failures < rb.Attempts {
				wait := b.Next() // with jitter, like every retry
				rb.say("move of bucket %s aborted (%v); retrying in %s (attempt %d of %d)", recBucket(rec), errs[i], wait.Round(time.Millisecond), failures+1, rb.Attempts)
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(wait):
				}
				continue
			}
		}
		return fmt.Errorf("rebalancer stopped: %w", errs[i])
	}
	return nil
}

// RunForever is the automatic mode. It never returns before ctx ends (or
// the session is closed): it waits to be the cluster's one elected
// rebalancer (the lock at topo.Paths.RebalanceLock), then runs whenever the
// map or the rebalance record changes, and after a stop (pause, node down,
// failed move, ZooKeeper away) tries again with backoff (2 s doubling to
// 1 min) and on every such change. If the lock is lost (the session was
// lost, so another rebalancer may be elected) the run in progress is
// cancelled, and it waits for ZooKeeper and stands for election again.
//
// From the start, elected or not, it also runs the orphan watcher
// (Mover.WatchOrphans), which gives every unfinished move whose mover is
// gone an owner. A pause stops new moves, not that healing. The elected
// rebalancer leaves unfinished moves to the watcher: it plans around them
// (their bucket and nodes count as busy) and waits for them.
func (rb *Rebalancer) RunForever(ctx context.Context) error {
	octx, stopOrphans := context.WithCancel(ctx)
	orphansDone := make(chan struct{})
	go func() { defer close(orphansDone); rb.mv.WatchOrphans(octx) }()
	defer func() { stopOrphans(); <-orphansDone }()
	rb.watcherRuns = true
	wait := backoff.New(time.Second, 30*time.Second)
	for {
		err := rb.lead(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, zksession.ErrClosed) {
			return err
		}
		d := wait.Next()
		rb.log.Warn("rebalancer lost its lock or could not take it; standing for election again", zap.Duration("in", d), zap.Error(err))
		if rb.Progress != nil {
			rb.Progress(Progress{Message: fmt.Sprintf("not the rebalancer any more (%v); standing for election again", err)})
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		_ = rb.mv.s.WaitConnected(wctx)
		cancel()
	}
}

// lead takes the rebalancer lock (waiting for another holder to go) and
// runs until ctx ends or the lock is lost.
func (rb *Rebalancer) lead(ctx context.Context) error {
	s, p := rb.mv.s, rb.mv.p
	lock, err := topo.LockRebalance(ctx, s, p, []byte(rb.mv.runner), func(le *zksession.LockedError) {
		rb.say("another rebalancer (%s) is running; waiting for it to go away", le.Holder)
	})
	if err != nil {
		return err
	}
	defer lock.Release(context.WithoutCancel(ctx))
	ctx, cancel := lock.Context(ctx)
	defer cancel()
	stopped := func() error {
		if cause := context.Cause(ctx); errors.Is(cause, zksession.ErrLockLost) {
			return fmt.Errorf("rebalancer stopped: %w", cause)
		}
		return ctx.Err()
	}
	rb.say("elected as the cluster's rebalancer")
	mode := ""
	mapW := topo.WatchMap(ctx, s, p)
	defer mapW.Stop()
	recW := topo.WatchRebalance(ctx, s, p)
	defer recW.Stop()
	retry := backoff.New(2*time.Second, time.Minute)
	var again <-chan time.Time // after a stop: try again then
	lastStop := ""
	for {
		select {
		case <-ctx.Done():
			return stopped()
		case <-mapW.C:
		case <-recW.C:
		case <-again:
		}
		// Debounce bursts of changes (our own moves change the map too).
		select {
		case <-ctx.Done():
			return stopped()
		case <-time.After(500 * time.Millisecond):
		}
		if err := rb.noteMode(ctx, &mode); err != nil && ctx.Err() == nil {
			rb.log.Warn("rebalancer could not read its record", zap.Error(err))
		}
		rep, err := rb.Run(ctx)
		if ctx.Err() != nil {
			return stopped()
		}
		if err != nil {
			again = time.After(retry.Next())
			// Said once per reason, not once per retry, with what to
			// run (the hint).
			if msg := hint.Text(err); msg != lastStop {
				lastStop = msg
				if errors.Is(err, ErrWaitingForMoves) {
					rb.log.Info("rebalancer waiting for unfinished moves", zap.Error(err))
				} else {
					rb.log.Warn("rebalancer stopped; trying again on the next change or with backoff", zap.Error(err))
				}
				if rb.Progress != nil {
					rb.Progress(Progress{Message: "stopped: " + msg})
				}
			}
			continue
		}
		again, lastStop = nil, ""
		retry.Reset()
		if len(rep.Moves) > 0 || rep.Splits > 0 || rep.Reassigned > 0 {
			rb.say("run finished: %d moves, %d splits, %d reassigned", len(rep.Moves), rep.Splits, rep.Reassigned)
		}
	}
}

// noteMode says what the cluster balances when the watcher is elected
// (*last is "") and whenever that changes since *last: another command
// changed what the watcher plans, which it must never do silently.
func (rb *Rebalancer) noteMode(ctx context.Context, last *string) error {
	rec, err := rb.State(ctx)
	if err != nil {
		return err
	}
	mode := rec.Mode()
	if mode == *last {
		return nil
	}
	plans := "plans moves by bucket count"
	if mode != topo.BalanceCount {
		plans = "heals unfinished moves but plans none by count (`shardctl rebalance --by " + mode + "` balances it by " + mode + ", once)"
	}
	fields := []zap.Field{zap.String("new", mode)}
	if rec != nil && rec.BySetAt != nil {
		fields = append(fields, zap.String("set_by", rec.BySetBy), zap.Time("set_at", *rec.BySetAt))
	}
	var msg string
	if *last == "" {
		msg = fmt.Sprintf("the cluster %s: the watcher %s; %s", DescribeMode(rec), plans, ModeHint(mode))
		rb.log.Info(msg, fields...)
	} else {
		msg = fmt.Sprintf("balance mode changed from %s to %s: the cluster %s; the watcher now %s; %s", *last, mode, DescribeMode(rec), plans, ModeHint(mode))
		rb.log.Warn(msg, append(fields, zap.String("old", *last))...)
	}
	if rb.Progress != nil {
		rb.Progress(Progress{Message: msg})
	}
	*last = mode
	return nil
}
