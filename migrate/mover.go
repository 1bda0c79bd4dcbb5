package migrate

// The Mover: its options, the errors a caller tests for, and what it
// keeps across runs (the members' view, the runs it holds, its thaws).
// The package's files follow a move's phases: api.go, run.go, drive.go,
// prepare.go, catchup.go (with copy.go), pause.go, finish.go (with
// verify.go and reverse.go), abort.go.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Options tune moves.
type Options struct {
	// MaxLag is the replication delay (a marker's trip from source to
	// target) under which the mover may fence. Default 250 ms.
	MaxLag time.Duration
	// CatchupTimeout bounds the wait for the lag to fall. Default 5 min.
	CatchupTimeout time.Duration
	// CopyTimeout bounds the initial copy. Default 1 h.
	CopyTimeout time.Duration
	// PauseCap is the longest write pause allowed; a move that would pause
	// longer is aborted before its flip. Default 2 s.
	PauseCap time.Duration
	// MemberWait bounds the wait for every live router and supervisor to
	// apply the map that sets the bucket moving. Default 10 s.
	MemberWait time.Duration
	// OnStraggler is what a move does with the members that have not
	// applied that map when MemberWait runs out: StragglerProceed (the
	// default) or StragglerAbort.
	OnStraggler string
	// Metrics, if set, counts stragglers and times the member wait.
	Metrics *Metrics
	Logger  *zap.Logger
	// Progress, when set, receives a line per state and copy progress,
	// with the move's record.
	Progress func(Progress)
	// Window is how long a move keeps its reverse stream after a good
	// verification, so that `move rollback` can give the bucket back
	// with the writes made since the flip; 0 completes the move as soon
	// as it is verified (the stream still serves the automatic rollback
	// of a copy that differs). GC prunes the old owner's rows only after.
	Window time.Duration
	// AbortRetry bounds how long an abort retries a cleanup that failed
	// while both nodes answer (a fence change that hit its lock timeout
	// because a writer held a transaction open, say) before it leaves the
	// move aborting for a resume. Default 1 min.
	AbortRetry time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxLag <= 0 {
		o.MaxLag = 250 * time.Millisecond
	}
	if o.CatchupTimeout <= 0 {
		o.CatchupTimeout = 5 * time.Minute
	}
	if o.CopyTimeout <= 0 {
		o.CopyTimeout = time.Hour
	}
	if o.PauseCap <= 0 {
		o.PauseCap = 2 * time.Second
	}
	if o.MemberWait <= 0 {
		o.MemberWait = 10 * time.Second
	}
	if o.OnStraggler == "" {
		o.OnStraggler = StragglerProceed
	}
	if o.AbortRetry <= 0 {
		o.AbortRetry = time.Minute
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// What a move does with stragglers (Options.OnStraggler).
const (
	// StragglerProceed goes on without them: the fence refuses their
	// clients' writes to the old owner until they catch up (see
	// docs/moves.md, "Stragglers"), so one hung web head cannot stop every
	// move.
	StragglerProceed = "proceed"
	// StragglerAbort aborts the move, as movers did before the option.
	StragglerAbort = "abort"
)

// CheckOnStraggler says whether s is an Options.OnStraggler value.
func CheckOnStraggler(s string) error {
	if s != StragglerProceed && s != StragglerAbort {
		return fmt.Errorf("on-straggler %q is neither %q nor %q", s, StragglerProceed, StragglerAbort)
	}
	return nil
}

// Errors a caller can test for.
var (
	ErrVerifyMismatch = errors.New("verification found a difference between source and target")
	ErrPauseCap       = errors.New("the write pause would exceed its cap")
	ErrBusy           = errors.New("move is being run by another mover")
)

// Mover runs moves for one cluster.
type Mover struct {
	st     *bucketmap.Store
	s      *zksession.Session
	p      topo.Paths
	opts   Options
	log    *zap.Logger
	runner string

	viewMu sync.Mutex
	view   *fleet.MemberView // started by the first fence step; Close stops it

	// thawed holds when this process ended a move's write pause without
	// ZooKeeper (run.thawInPause), for the resume that records it.
	thawMu sync.Mutex
	thawed map[string]time.Time

	// running: moves whose runner lock a run of this process holds.
	runMu   sync.Mutex
	running map[string]bool

	// beforeMarkIncoming, when set (by a test), runs in prepare right
	// before the target's range is marked incoming.
	beforeMarkIncoming func()
}

func (mv *Mover) setRunning(id string, on bool) {
	mv.runMu.Lock()
	defer mv.runMu.Unlock()
	if mv.running == nil {
		mv.running = map[string]bool{}
	}
	if on {
		mv.running[id] = true
	} else {
		delete(mv.running, id)
	}
}

// runs reports whether a run of this process holds move id's lock.
func (mv *Mover) runs(id string) bool {
	mv.runMu.Lock()
	defer mv.runMu.Unlock()
	return mv.running[id]
}

func (mv *Mover) noteThaw(id string, at time.Time) {
	mv.thawMu.Lock()
	defer mv.thawMu.Unlock()
	if mv.thawed == nil {
		mv.thawed = map[string]time.Time{}
	}
	mv.thawed[id] = at
}

func (mv *Mover) thawTime(id string) (time.Time, bool) {
	mv.thawMu.Lock()
	defer mv.thawMu.Unlock()
	t, ok := mv.thawed[id]
	return t, ok
}

// New returns a mover using the store's session.
func New(st *bucketmap.Store, opts Options) *Mover {
	opts = opts.withDefaults()
	host, _ := os.Hostname()
	return &Mover{st: st, s: st.Session(), p: st.Paths(), opts: opts, log: opts.Logger.With(zap.String("component", "mover")),
		runner: fmt.Sprintf("%s-%d", host, os.Getpid())}
}

// checkOptions refuses options that withDefaults cannot mend.
func (mv *Mover) checkOptions() error {
	if err := CheckOnStraggler(mv.opts.OnStraggler); err != nil {
		return fmt.Errorf("mover options: %w", err)
	}
	return nil
}

// Close stops following the cluster's members (the view the fence steps
// wait on). Moves run afterwards start a new one. Closing the session
// stops it too.
func (mv *Mover) Close() {
	mv.viewMu.Lock()
	defer mv.viewMu.Unlock()
	if mv.view != nil {
		mv.view.Close()
		mv.view = nil
	}
}

// members is the view of the members' applied map versions that the fence
// steps wait on. It lives as long as the Mover, not one wait: a rebalance
// runs many moves, one after another and side by side, and a view per wait
// would list and read all N member records and arm N watches for every
// move; this one does that once, then reads a record only when it changes.
// Between waits it costs little: members change their records when a map
// changes, which during a rebalance is mostly the moves' own doing, and the
// waits would read those changes anyway.
func (mv *Mover) members() *fleet.MemberView {
	mv.viewMu.Lock()
	defer mv.viewMu.Unlock()
	if mv.view == nil {
		mv.view = fleet.WatchMembers(context.Background(), mv.s, mv.p)
	}
	return mv.view
}

// pause stops the rebalancer until an operator resumes it.
func (mv *Mover) pause(ctx context.Context, reason, move string) error {
	rec, err := modeOf(ctx, mv)
	if err != nil {
		return err
	}
	rec.Paused, rec.Reason, rec.Move, rec.At = true, reason, move, time.Now().UTC()
	return topo.WriteRebalance(ctx, mv.s, mv.p, rec)
}

// modeOf is a fresh rebalance record carrying the current one's balance
// mode and who set it, which pause and resume keep.
func modeOf(ctx context.Context, mv *Mover) (topo.RebalanceRecord, error) {
	out := topo.RebalanceRecord{Version: topo.RebalanceVersion}
	rec, err := topo.ReadRebalance(ctx, mv.s, mv.p)
	if err != nil || rec == nil {
		return out, err
	}
	out.By, out.BySetBy, out.BySetAt = rec.By, rec.BySetBy, rec.BySetAt
	return out, nil
}
