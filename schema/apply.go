package schema

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/user"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/sqlstate"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Options tune Apply, CatchUp and Adopt. The zero value is the defaults.
type Options struct {
	// Canary is the node a new change runs on first, alone; "" picks the
	// node owning the fewest buckets but at least one (ties: the lowest
	// id), where a bad change hurts the fewest users and still meets data.
	Canary string
	// Parallel bounds the nodes changed at once after the canary (4).
	Parallel int
	// LockTimeout is each attempt's lock_timeout (250ms): an application
	// write queued behind the change's lock request waits at most this
	// long before the change gives way and tries again.
	LockTimeout time.Duration
	// Retries bounds the attempts after a lock timeout, per node (40,
	// with a backoff from 50ms to 1s between them).
	Retries int
	// WaitMoves bounds the wait for moves past their start (10m).
	WaitMoves time.Duration
	// CloseWindow ends a move's rollback window (migrate's Complete)
	// before a change a reverse stream cannot carry (StreamSafe); why
	// says which statement. Nil: such a change waits for the windows to
	// end, like any move in flight. A change a stream carries never waits
	// for windows.
	CloseWindow func(ctx context.Context, rec *topo.MoveRecord, why string) error
	// ConnectTimeout bounds connecting to a node (10s).
	ConnectTimeout time.Duration
	// BlockerWait bounds the wait, after a lock timeout, for the
	// transactions that held the lock to end before the next attempt
	// (30s); meanwhile the change queues nothing.
	BlockerWait time.Duration
	// By names who applies (user@host by default).
	By  string
	Log *zap.Logger
	// Progress receives each step; calls never overlap, though nodes are
	// changed at once.
	Progress func(Event)

	events *sync.Mutex // serializes Progress
}

// Event is one step of Apply, CatchUp or Adopt, for progress output.
type Event struct {
	Node    string `json:"node,omitempty"`
	Change  string `json:"change,omitempty"`
	Message string `json:"message"`
}

func (o *Options) defaults() {
	if o.events == nil {
		o.events = &sync.Mutex{}
	}
	if o.Parallel <= 0 {
		o.Parallel = 4
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = 250 * time.Millisecond
	}
	if o.Retries <= 0 {
		o.Retries = 40
	}
	if o.WaitMoves <= 0 {
		o.WaitMoves = 10 * time.Minute
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.BlockerWait <= 0 {
		o.BlockerWait = 30 * time.Second
	}
	if o.By == "" {
		o.By = Who()
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
}

func (o *Options) event(e Event) {
	o.Log.Info("schema: "+e.Message, zap.String("node", e.Node), zap.String("change", e.Change))
	if o.Progress != nil {
		o.events.Lock()
		defer o.events.Unlock()
		o.Progress(e)
	}
}

// Who is user@host of this process.
func Who() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

// Errors of Apply, CatchUp and Adopt, for errors.Is.
var (
	// ErrCanaryFailed: the change failed on its canary and no other node
	// was touched.
	ErrCanaryFailed = errors.New("the change failed on its canary node; no other node was touched")
	// ErrPartial: the change is applied on some nodes and not others.
	ErrPartial = errors.New("the change is not applied on every node")
	// ErrEdited: a change applied somewhere was given a different text.
	ErrEdited = errors.New("an applied change cannot be edited")
	// ErrDuplicate: the same text is recorded under another id.
	ErrDuplicate = errors.New("the same SQL is already recorded as another change")
	// ErrMovesInFlight: moves past their start did not end in time.
	ErrMovesInFlight = errors.New("moves are in flight")
	// ErrUnknownNode: a node the command names is not in the registry
	// (or is marked down).
	ErrUnknownNode = errors.New("no such node")
)

// NodeResult is what one node did.
type NodeResult struct {
	Node string `json:"node"`
	// State: applied (now or before), failed, unreachable, or skipped.
	State string `json:"state"`
	// Ran lists the changes run on the node now, in order: earlier
	// changes it lacked come before the one applied.
	Ran          []string `json:"ran"`
	Error        string   `json:"error,omitempty"`
	Hint         string   `json:"hint,omitempty"` // what to run about Error (package hint)
	Attempts     int      `json:"attempts,omitempty"`
	LockTimeouts int      `json:"lock_timeouts,omitempty"`
	// BlockedMaxMS is the change's longest attempt on this node: about
	// the longest an application write there queued behind it.
	BlockedMaxMS float64 `json:"blocked_max_ms"`
	// AppWaitMaxMS is the longest an application statement was seen
	// waiting behind the change (sampled every 25 ms from a second
	// connection: a lower bound within that).
	AppWaitMaxMS float64 `json:"app_wait_max_ms"`
	// BlockerWaitMS is the time spent between attempts waiting for the
	// transactions that held the lock to end.
	BlockerWaitMS float64 `json:"blocker_wait_ms,omitempty"`
}

// Result is what Apply or CatchUp did.
type Result struct {
	ID      string       `json:"id"`
	Seq     int          `json:"seq"`
	SHA256  string       `json:"sha256"`
	Mode    string       `json:"mode"`
	NoTx    string       `json:"outside_transaction,omitempty"`
	New     bool         `json:"new"`
	State   string       `json:"state"`
	Canary  string       `json:"canary,omitempty"`
	Missing []string     `json:"missing"`
	Skipped []string     `json:"skipped_down"`
	Nodes   []NodeResult `json:"nodes"`
	// WaitedMS is how long the change waited for moves in flight.
	WaitedMS float64 `json:"waited_for_moves_ms"`
	// Windows are the reverse streams of the moves in their rollback
	// window that the change ran beside, each checked afterwards.
	Windows []WindowResult `json:"windows,omitempty"`
	// Closed are the moves whose windows the change closed first: it is
	// not one a reverse stream carries (Why).
	Closed []string `json:"closed_windows,omitempty"`
	Why    string   `json:"not_stream_safe,omitempty"`
}

// applier is one run of Apply or CatchUp, holding the schema lock.
type applier struct {
	s    *zksession.Session
	p    topo.Paths
	opt  *Options
	m    *bucketmap.Map
	hist []*topo.SchemaChange

	mu       sync.Mutex // guards each record's Nodes and State, and vers
	vers     map[string]int32
	required []string // the nodes every change must reach (not marked down or removed)
	// windows are the moves in their rollback window the change runs
	// beside (a change a reverse stream carries).
	windows []*topo.MoveRecord
	closed  []string // moves whose windows the change closed first
}

// windowPolicy is what begin does about moves in their rollback window.
type windowPolicy struct {
	runBeside bool   // the change is one a reverse stream carries
	why       string // else why not
	close     bool   // close them (Options.CloseWindow), else wait
}

// begin takes the schema lock, waits for the moves involved to leave
// their data states and reads the map and the history.
func begin(ctx context.Context, st *bucketmap.Store, opt *Options, involved func(*topo.MoveRecord) bool, wp windowPolicy) (*applier, *zksession.Lock, time.Duration, error) {
	opt.defaults()
	s, p := st.Session(), st.Paths()
	holder := []byte(fmt.Sprintf("%s pid %d", opt.By, os.Getpid()))
	lock, err := topo.LockSchema(ctx, s, p, holder, func(le *zksession.LockedError) {
		opt.event(Event{Message: fmt.Sprintf("waiting for the schema lock, held by %s", le.Holder)})
	})
	if err != nil {
		return nil, nil, 0, fmt.Errorf("taking the schema lock: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = lock.Release(context.WithoutCancel(ctx))
		}
	}()
	lctx, cancel := lock.Context(ctx)
	defer cancel()
	a := &applier{s: s, p: p, opt: opt}
	waited, err := a.waitMoves(lctx, involved, wp)
	if err != nil {
		return nil, nil, waited, err
	}
	// Moves that compared schemas before this point compare again.
	if err := topo.BumpSchemaEpoch(lctx, s, p); err != nil {
		return nil, nil, waited, a.closedSoFar(fmt.Errorf("marking the schema change: %w", err))
	}
	if a.m, _, err = st.Load(ctx); err != nil {
		return nil, nil, waited, a.closedSoFar(err)
	}
	a.required = Required(a.m)
	if err := a.load(ctx); err != nil {
		return nil, nil, waited, a.closedSoFar(err)
	}
	ok = true
	return a, lock, waited, nil
}

// load reads the history with each record's znode version.
func (a *applier) load(ctx context.Context) error {
	hist, vers, err := topo.ReadSchemaHistory(ctx, a.s, a.p)
	if err != nil {
		return fmt.Errorf("reading the schema history: %w", err)
	}
	a.hist, a.vers = hist, vers
	return nil
}

// waitMoves waits until no move the change involves is past its start
// (state prepare, or final, or failed: a failed move streams nothing),
// but for moves in their rollback window when the change runs beside
// them (wp.runBeside: kept in a.windows) or closes them first. Moves
// still in prepare wait at the gate (topo.EnterMoveData) for as long as
// the lock is held, so no window opens while the change runs. A rollback
// (a move of its own, started in catch-up over the stream) may run
// meanwhile: the subscriber-first order keeps its stream whole at every
// point, and the check afterwards reports the window ended.
func (a *applier) waitMoves(ctx context.Context, involved func(*topo.MoveRecord) bool, wp windowPolicy) (time.Duration, error) {
	start := time.Now()
	var said time.Time
	for {
		recs, busy, err := movesInFlight(ctx, a.s, a.p, involved)
		if err != nil {
			return time.Since(start), err
		}
		a.windows = nil
		var others []string
		var toClose []*topo.MoveRecord
		for i, rec := range recs {
			switch {
			case !inWindow(rec):
				others = append(others, busy[i])
			case wp.runBeside:
				a.windows = append(a.windows, rec)
			case wp.close && a.opt.CloseWindow != nil:
				toClose = append(toClose, rec)
			default:
				others = append(others, busy[i]+" in its rollback window")
			}
		}
		// Windows are closed last, once nothing else holds the change:
		// a change that then gave up waiting would have ended them for
		// nothing.
		if len(others) == 0 && len(toClose) > 0 {
			for _, rec := range toClose {
				a.opt.event(Event{Message: fmt.Sprintf("closing the rollback window of move %s (%s -> %s) first: the change is not one its reverse stream carries (%s)", rec.ID, rec.Source, rec.Target, wp.why)})
				if err := a.opt.CloseWindow(ctx, rec, wp.why); err != nil {
					return time.Since(start), a.closedSoFar(fmt.Errorf("closing the rollback window of move %s: %w", rec.ID, err))
				}
				a.closed = append(a.closed, rec.ID)
			}
			continue // read again: what the closes left
		}
		if len(others) == 0 {
			if len(a.windows) > 0 {
				a.opt.event(Event{Message: fmt.Sprintf("running beside %d moves in their rollback window, their old owners first; each reverse stream is checked afterwards", len(a.windows))})
			}
			return time.Since(start), nil
		}
		waited := time.Since(start)
		if len(toClose) > 0 {
			others = append(others, fmt.Sprintf("then %d rollback windows to close", len(toClose)))
		}
		if waited >= a.opt.WaitMoves {
			h := "a move in its rollback window ends it early with `shardctl move complete ID`; then apply again"
			if wp.why != "" {
				h = "the change is not one a reverse stream carries (" + wp.why + "): close the windows with `shardctl schema apply --windows close` or `shardctl move complete ID`"
			}
			return waited, hint.New(fmt.Errorf("%w after %s: %s", ErrMovesInFlight, waited.Round(time.Second), strings.Join(others, "; ")), h)
		}
		if time.Since(said) >= 5*time.Second {
			a.opt.event(Event{Message: fmt.Sprintf("waiting for %d moves to finish before changing the schema: %s", len(others), strings.Join(others, "; "))})
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// closedSoFar adds to err the windows closed before it: they stay closed.
func (a *applier) closedSoFar(err error) error {
	if len(a.closed) == 0 {
		return err
	}
	return fmt.Errorf("%w (the rollback windows of moves %s were closed before)", err, strings.Join(a.closed, ", "))
}

// movesInFlight returns the moves past their start the change involves,
// each with how it is named in messages, sorted by id.
func movesInFlight(ctx context.Context, s *zksession.Session, p topo.Paths, involved func(*topo.MoveRecord) bool) ([]*topo.MoveRecord, []string, error) {
	ids, err := topo.ListMoves(ctx, s, p)
	if err != nil {
		return nil, nil, err
	}
	slices.Sort(ids)
	var recs []*topo.MoveRecord
	var busy []string
	for _, id := range ids {
		rec, _, err := topo.ReadMove(ctx, s, p, id)
		if errors.Is(err, zksession.ErrNoNode) {
			continue
		}
		if err != nil {
			// Unreadable: waited for, never run beside.
			recs = append(recs, &topo.MoveRecord{ID: id})
			busy = append(busy, fmt.Sprintf("move %s (record unreadable: %v)", id, err))
			continue
		}
		if rec.Finished() || rec.State == topo.MovePrepare || rec.State == topo.MoveFailed {
			continue
		}
		if involved != nil && !involved(rec) {
			continue
		}
		recs = append(recs, rec)
		busy = append(busy, fmt.Sprintf("move %s (%s -> %s, %s)", rec.ID, rec.Source, rec.Target, rec.State))
	}
	return recs, busy, nil
}

// find returns the recorded change with id, or nil.
func (a *applier) find(id string) *topo.SchemaChange {
	for _, c := range a.hist {
		if c.ID == id {
			return c
		}
	}
	return nil
}

// record writes a node's status of change c, by compare-and-swap (under
// the schema lock nobody else writes; a conflict re-reads and merges).
func (a *applier) record(ctx context.Context, c *topo.SchemaChange, node string, st *topo.SchemaNodeStatus) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	c.Nodes[node] = st
	c.State, _ = topo.SchemaState(c, a.required)
	c.UpdatedAt = time.Now().UTC()
	v, err := topo.UpdateSchemaChange(ctx, a.s, a.p, c, a.vers[c.ID])
	if err != nil {
		// Under the schema lock nobody else writes the record: a
		// conflict means the lock was lost to another run, whose record
		// this one must not overwrite.
		return fmt.Errorf("recording change %s on node %s: %w", c.ID, node, err)
	}
	a.vers[c.ID] = v
	return nil
}

// failedNowhere reports whether c failed on its canary and is applied
// (even in part) on no node.
func (a *applier) failedNowhere(c *topo.SchemaChange) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return FailedNowhere(c)
}

// FailedNowhere reports whether change c failed on its canary and was
// applied, even in part, on no node: later changes do not wait for it.
func FailedNowhere(c *topo.SchemaChange) bool {
	if c.State != topo.SchemaFailed {
		return false
	}
	for _, st := range c.Nodes {
		if st.State == topo.SchemaApplied || st.StatementsDone > 0 {
			return false
		}
	}
	return true
}

func (a *applier) applied(c *topo.SchemaChange, node string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return c.Applied(node)
}

// bringUp runs on node every recorded change up to Seq upto that the node
// lacks, in order, stopping at the first that fails. The node's own table
// says what it has; the records are brought in line with it.
func (a *applier) bringUp(ctx context.Context, n bucketmap.Node, upto int) NodeResult {
	node := string(n.ID)
	res := NodeResult{Node: node, State: topo.SchemaApplied, Ran: []string{}}
	target := a.hist[len(a.hist)-1]
	for _, c := range a.hist {
		if c.Seq == upto {
			target = c
		}
	}
	stmtsDone := 0 // of the change that failed, in ModeStatements: it is applied in part
	fail := func(c *topo.SchemaChange, state string, err error) NodeResult {
		res.State, res.Error, res.Hint = state, err.Error(), hint.Of(err)
		now := time.Now().UTC()
		st := &topo.SchemaNodeStatus{State: state, At: &now, Error: err.Error(), Attempts: res.Attempts, LockTimeouts: res.LockTimeouts,
			BlockedMaxMS: res.BlockedMaxMS, AppWaitMaxMS: res.AppWaitMaxMS, StatementsDone: stmtsDone}
		if rerr := a.record(ctx, c, node, st); rerr != nil {
			res.Error += "; " + rerr.Error()
		}
		a.opt.event(Event{Node: node, Change: c.ID, Message: state + ": " + err.Error()})
		return res
	}
	conn, err := connect(ctx, n, a.opt.ConnectTimeout)
	if err != nil {
		return fail(target, topo.SchemaUnreachable, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// A second connection watches each attempt (monitor.go); without
	// it the change still runs, measuring less.
	watcher, err := connect(ctx, n, a.opt.ConnectTimeout)
	if err != nil {
		a.opt.event(Event{Node: node, Message: fmt.Sprintf("no second connection to watch the change's locks: %v", err)})
		watcher = nil
	} else {
		defer watcher.Close(context.WithoutCancel(ctx))
	}
	if err := ensureHistory(ctx, conn); err != nil {
		return fail(target, stateOf(err), fmt.Errorf("creating shardvisor.schema_changes: %w", err))
	}
	rows, err := readRows(ctx, conn)
	if err != nil {
		return fail(target, stateOf(err), fmt.Errorf("reading shardvisor.schema_changes: %w", err))
	}
	for _, c := range a.hist {
		if c.Seq > upto {
			break
		}
		row, ok := rows[c.ID]
		if c.Seq < upto && !ok && a.failedNowhere(c) {
			// A change that failed on its canary and was applied
			// nowhere does not hold back the ones after it.
			continue
		}
		if ok && row.SHA256 != c.SHA256 {
			return fail(c, topo.SchemaFailed, fmt.Errorf("the node's shardvisor.schema_changes has change %s with another text (sha256 %.12s, recorded %.12s); the node was changed by hand", c.ID, row.SHA256, c.SHA256))
		}
		if ok && row.Done {
			if !a.applied(c, node) {
				now := time.Now().UTC()
				if err := a.record(ctx, c, node, &topo.SchemaNodeStatus{State: topo.SchemaApplied, At: &now, StatementsDone: c.Statements}); err != nil {
					return fail(c, topo.SchemaUnreachable, err)
				}
			}
			continue
		}
		a.opt.event(Event{Node: node, Change: c.ID, Message: "applying"})
		att, err := runChange(ctx, conn, watcher, node, c, row, a.opt)
		res.Attempts += att.Attempts
		res.LockTimeouts += att.LockTimeouts
		res.BlockedMaxMS = max(res.BlockedMaxMS, ms(att.BlockedMax))
		res.AppWaitMaxMS = max(res.AppWaitMaxMS, ms(att.AppWait))
		res.BlockerWaitMS += ms(att.BlockerWait)
		if err != nil {
			stmtsDone = att.StatementsDone
			if duplicateObject(err) {
				err = hint.New(fmt.Errorf("%w; the node has what the change creates, but its shardvisor.schema_changes does not record the change", err),
					"if the node is in step, `shardctl schema adopt --from NODE` (a node with the whole history) records it")
			}
			return fail(c, stateOf(err), err)
		}
		res.Ran = append(res.Ran, c.ID)
		now := time.Now().UTC()
		if err := a.record(ctx, c, node, &topo.SchemaNodeStatus{State: topo.SchemaApplied, At: &now, Attempts: att.Attempts,
			LockTimeouts: att.LockTimeouts, BlockedMaxMS: ms(att.BlockedMax), AppWaitMaxMS: ms(att.AppWait), StatementsDone: att.StatementsDone}); err != nil {
			return fail(c, topo.SchemaUnreachable, err)
		}
		a.opt.event(Event{Node: node, Change: c.ID, Message: fmt.Sprintf("applied (%d attempts; longest attempt %s; application statements seen waiting at most %s)",
			att.Attempts, att.BlockedMax.Round(time.Millisecond), att.AppWait.Round(time.Millisecond))})
		// A change may have set session state (pg_dump's search_path).
		if _, err := conn.Exec(ctx, "RESET ALL"); err != nil {
			return fail(c, stateOf(err), err)
		}
	}
	return res
}

// stateOf is the node state an error leaves: failed when the node refused
// the SQL, unreachable otherwise (trying again may work).
func stateOf(err error) string {
	if errors.Is(err, ErrStatement) || isStatementError(err) {
		return topo.SchemaFailed
	}
	return topo.SchemaUnreachable
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Apply applies one change to every db node in the registry not marked
// down, prepared or not: first to the canary alone, then to the others,
// opt.Parallel at a time. Each node first gets the recorded changes it
// lacks, in order. It holds the cluster's schema lock throughout, after
// waiting for the moves past their start to finish; moves that start
// meanwhile wait for the change.
//
// The change is recorded before it runs anywhere. Applying it again is a
// no-op where it is applied and resumes where it is not. Errors:
// ErrCanaryFailed (nothing else touched), ErrPartial (the Result names
// the nodes that miss it), ErrEdited, ErrDuplicate, ErrMovesInFlight.
func Apply(ctx context.Context, st *bucketmap.Store, ch *Change, opt Options) (*Result, error) {
	safe, why := StreamSafe(ch.SQL)
	a, lock, waited, err := begin(ctx, st, &opt, nil, windowPolicy{runBeside: safe, why: why, close: true})
	if err != nil {
		return nil, err
	}
	defer lock.Release(context.WithoutCancel(ctx))
	ctx, cancel := lock.Context(ctx)
	defer cancel()
	res := &Result{ID: ch.ID, SHA256: ch.SHA256, Mode: ch.Mode, NoTx: ch.NoTx, WaitedMS: ms(waited), Nodes: []NodeResult{}, Missing: []string{}, Skipped: []string{},
		Closed: a.closed}
	if len(a.closed) > 0 {
		res.Why = why
	}
	errsBefore := a.windowErrors(ctx)
	c, err := a.recordChange(ctx, ch, res)
	if err != nil {
		return res, err
	}
	res.Seq = c.Seq
	for _, n := range a.m.Nodes() {
		if n.State == bucketmap.NodeDown {
			res.Skipped = append(res.Skipped, string(n.ID))
		}
	}
	if len(a.required) == 0 {
		return res, fmt.Errorf("%w: the registry has no node that is not marked down or removed", ErrPartial)
	}
	candidates, err := a.pickCanary(c)
	if err != nil {
		return res, err
	}
	skip := map[string]bool{}
	for _, canary := range candidates {
		res.Canary = canary
		a.mu.Lock()
		c.Canary = canary
		a.mu.Unlock()
		a.opt.event(Event{Node: canary, Change: c.ID, Message: "canary first"})
		n, _ := a.m.Node(bucketmap.NodeID(canary))
		nr := a.bringUp(ctx, n, c.Seq)
		res.Nodes = append(res.Nodes, nr)
		skip[canary] = true
		if nr.State == topo.SchemaApplied {
			break
		}
		a.mu.Lock()
		res.State, res.Missing = topo.SchemaState(c, a.required)
		a.mu.Unlock()
		if nr.State != topo.SchemaUnreachable {
			return res, hint.New(fmt.Errorf("%w: %s", ErrCanaryFailed, nr.Error), nr.Hint)
		}
		if a.opt.Canary != "" || len(skip) == len(candidates) {
			return res, fmt.Errorf("canary node %s is unreachable, no other node was touched: %s (choose another with --canary NODE)", canary, nr.Error)
		}
		a.opt.event(Event{Node: canary, Change: c.ID, Message: "the canary is unreachable: trying the next one"})
	}
	// An unreachable default canary is not tried twice. Beside reverse
	// streams, their publishers come last, and one waits for the
	// subscribers it feeds: without the column they would stop its
	// stream.
	others := slices.DeleteFunc(slices.Clone(a.required), func(id string) bool { return skip[id] })
	pubs := publishers(a.windows)
	first := slices.DeleteFunc(slices.Clone(others), func(id string) bool { return pubs[id] != nil })
	second := slices.DeleteFunc(slices.Clone(others), func(id string) bool { return pubs[id] == nil })
	res.Nodes = append(res.Nodes, a.bringUpAll(ctx, first, c.Seq)...)
	done := map[string]bool{}
	for _, nr := range res.Nodes {
		done[nr.Node] = nr.State == topo.SchemaApplied
	}
	var held []NodeResult
	mutual := slices.Clone(second)
	second = slices.DeleteFunc(second, func(id string) bool {
		for _, sub := range pubs[id] {
			// A subscriber in the second wave too (two moves each
			// way) does not hold it back: its stream stops at most
			// until the subscriber has the change, and the check
			// below starts it again. One that failed or was
			// unreachable does (one marked down streams nothing).
			if slices.Contains(a.required, sub) && !done[sub] && !slices.Contains(mutual, sub) {
				held = append(held, NodeResult{Node: id, State: "held", Ran: []string{},
					Error: fmt.Sprintf("not changed: it publishes a reverse stream to %s, which does not have the change; changed first, it would stop that stream", sub),
					Hint:  "run the same apply again once " + sub + " is fixed or back"})
				return true
			}
		}
		return false
	})
	res.Nodes = append(res.Nodes, a.bringUpAll(ctx, second, c.Seq)...)
	res.Nodes = append(res.Nodes, held...)
	for _, nr := range held {
		a.opt.event(Event{Node: nr.Node, Change: c.ID, Message: nr.Error})
	}
	res.Windows = a.checkWindows(ctx, errsBefore)
	a.mu.Lock()
	res.State, res.Missing = topo.SchemaState(c, a.required)
	a.mu.Unlock()
	if res.Missing == nil {
		res.Missing = []string{}
	}
	if res.State != topo.SchemaApplied {
		var why []string
		for _, nr := range res.Nodes {
			if nr.State != topo.SchemaApplied {
				why = append(why, fmt.Sprintf("%s %s: %s", nr.Node, nr.State, nr.Error))
			}
		}
		return res, hint.New(fmt.Errorf("%w: change %s is %s, missing on %s (%s)", ErrPartial, c.ID, res.State, strings.Join(res.Missing, ", "), strings.Join(why, "; ")),
			"run the same apply again once they are fixed or back")
	}
	return res, streamsBroken(res.Windows)
}

// bringUpAll brings nodes up to seq, opt.Parallel at a time.
func (a *applier) bringUpAll(ctx context.Context, nodes []string, seq int) []NodeResult {
	out := make([]NodeResult, len(nodes))
	sem := make(chan struct{}, a.opt.Parallel)
	var wg sync.WaitGroup
	for i, id := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			n, _ := a.m.Node(bucketmap.NodeID(id))
			out[i] = a.bringUp(ctx, n, seq)
		}()
	}
	wg.Wait()
	return out
}

// recordChange finds or creates the change's record: the same id and text
// resume it; a new text for an id applied nowhere replaces it.
func (a *applier) recordChange(ctx context.Context, ch *Change, res *Result) (*topo.SchemaChange, error) {
	for _, c := range a.hist {
		if c.SHA256 == ch.SHA256 && c.ID != ch.ID {
			return nil, fmt.Errorf("%w: %s (from %s, recorded %s by %s); give the change a new text or apply %s",
				ErrDuplicate, c.ID, c.Source, c.CreatedAt.Format(time.RFC3339), c.By, c.ID)
		}
	}
	now := time.Now().UTC()
	if c := a.find(ch.ID); c != nil {
		if c.SHA256 == ch.SHA256 {
			return c, nil
		}
		var on []string
		for n, st := range c.Nodes {
			if st.State == topo.SchemaApplied || st.StatementsDone > 0 {
				on = append(on, n)
			}
		}
		if len(on) == 0 {
			// The record may lag a node (a run killed between a node's
			// commit and its record): ask the nodes themselves.
			var err error
			if on, err = a.nodesWith(ctx, c); err != nil {
				return nil, fmt.Errorf("change %s has a new text (sha256 %.12s -> %.12s) and the nodes could not all be checked for the old one: %w", c.ID, c.SHA256, ch.SHA256, err)
			}
		}
		if len(on) > 0 {
			slices.Sort(on)
			return nil, fmt.Errorf("%w: change %s was recorded %s by %s from text sha256 %.12s and is applied on %s; %s now has sha256 %.12s. Write the new statements as a new change (a new file, or a new \"-- shardvisor:id\")",
				ErrEdited, c.ID, c.CreatedAt.Format(time.RFC3339), c.By, c.SHA256, strings.Join(on, ", "), ch.Source, ch.SHA256)
		}
		a.opt.event(Event{Change: c.ID, Message: fmt.Sprintf("replacing the text of change %s, applied nowhere (sha256 %.12s -> %.12s)", c.ID, c.SHA256, ch.SHA256)})
		a.mu.Lock()
		c.Replaced = append(c.Replaced, c.SHA256)
		c.SHA256, c.SQL, c.Mode, c.Statements, c.Source = ch.SHA256, ch.SQL, ch.Mode, ch.Statements, ch.Source
		c.Nodes, c.Canary, c.State, c.UpdatedAt = map[string]*topo.SchemaNodeStatus{}, "", topo.SchemaPending, now
		if last := a.hist[len(a.hist)-1]; last != c {
			// Changes recorded since run before it everywhere: so it
			// does on a node that replays the history.
			c.Seq = last.Seq + 1
			slices.SortFunc(a.hist, func(x, y *topo.SchemaChange) int { return x.Seq - y.Seq })
		}
		v, err := topo.UpdateSchemaChange(ctx, a.s, a.p, c, a.vers[c.ID])
		if err == nil {
			a.vers[c.ID] = v
		}
		a.mu.Unlock()
		return c, err
	}
	seq := 1
	if len(a.hist) > 0 {
		seq = a.hist[len(a.hist)-1].Seq + 1
	}
	c := &topo.SchemaChange{Version: topo.SchemaChangeVersion, ID: ch.ID, Seq: seq, SHA256: ch.SHA256, SQL: ch.SQL, Mode: ch.Mode,
		Statements: ch.Statements, Source: ch.Source, By: a.opt.By, CreatedAt: now, UpdatedAt: now, State: topo.SchemaPending,
		Nodes: map[string]*topo.SchemaNodeStatus{}}
	if err := topo.CreateSchemaChange(ctx, a.s, a.p, c); err != nil {
		return nil, fmt.Errorf("recording change %s: %w", c.ID, err)
	}
	a.vers[c.ID] = 0
	a.hist = append(a.hist, c)
	res.New = true
	a.opt.event(Event{Change: c.ID, Message: fmt.Sprintf("recorded as change %d (%s, %d statements)", seq, c.Mode, c.Statements)})
	return c, nil
}

// nodesWith returns the nodes whose own table has a row of change c (done
// or in part). A node that cannot be reached is an error when the record
// says the change ran there or got to it.
func (a *applier) nodesWith(ctx context.Context, c *topo.SchemaChange) ([]string, error) {
	var on []string
	for _, id := range a.required {
		n, _ := a.m.Node(bucketmap.NodeID(id))
		conn, err := connect(ctx, n, a.opt.ConnectTimeout)
		if err != nil {
			if st := c.Nodes[id]; st != nil && (st.Attempts > 0 || st.State != topo.SchemaUnreachable) {
				return nil, err
			}
			continue
		}
		rows, err := readRowsIfAny(ctx, conn)
		conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", id, err)
		}
		if _, ok := rows[c.ID]; ok {
			on = append(on, id)
		}
	}
	return on, nil
}

// pickCanary returns the canaries to try in order: --canary alone, or
// the nodes by the buckets they own, fewest first but those with none
// last (ties: lowest id), each tried until one is reached. None when the change has already passed a
// canary (it is applied somewhere: resuming needs none).
func (a *applier) pickCanary(c *topo.SchemaChange) ([]string, error) {
	if want := a.opt.Canary; want != "" {
		if !slices.Contains(a.required, want) {
			return nil, fmt.Errorf("--canary %s: %w among the nodes not marked down or removed (%s)", want, ErrUnknownNode, strings.Join(a.required, ", "))
		}
		if !c.Applied(want) {
			if subs := publishers(a.windows)[want]; len(subs) > 0 {
				a.opt.event(Event{Node: want, Change: c.ID, Message: fmt.Sprintf("the canary publishes reverse streams to %s: changed alone first, it stops them until they have the change too (the check afterwards starts them again)", strings.Join(subs, ", "))})
			}
			return []string{want}, nil
		}
	}
	for _, st := range c.Nodes {
		if st.State == topo.SchemaApplied {
			return nil, nil
		}
	}
	// A node with no bucket yet (just added) holds no data a change could
	// trip over: it comes last, not first.
	counts := a.m.Counts()
	key := func(id string) int {
		if c := counts[bucketmap.NodeID(id)]; c > 0 {
			return c
		}
		return math.MaxInt
	}
	out := slices.Clone(a.required)
	slices.SortStableFunc(out, func(x, y string) int { return cmp.Compare(key(x), key(y)) })
	// Beside reverse streams, a publisher is never the canary while
	// another node can be: changed alone, it would stop its streams.
	pubs := publishers(a.windows)
	slices.SortStableFunc(out, func(x, y string) int { return cmp.Compare(len(pubs[x]), len(pubs[y])) })
	return out, nil
}

// CatchUp brings one node in step with the recorded history (`node
// prepare` calls it before it installs the fence): every change the node
// lacks, in order, under the schema lock, after the moves to or from the
// node have left their data states. With no history it does nothing and
// returns nil.
func CatchUp(ctx context.Context, st *bucketmap.Store, node bucketmap.NodeID, opt Options) (*NodeResult, error) {
	hist, err := topo.ListSchemaChanges(ctx, st.Session(), st.Paths())
	if err != nil || len(hist) == 0 {
		return nil, err
	}
	// A replay of the history waits for the windows of the node's moves:
	// it may hold any change.
	a, lock, _, err := begin(ctx, st, &opt, func(r *topo.MoveRecord) bool { return r.Source == string(node) || r.Target == string(node) }, windowPolicy{})
	if err != nil {
		return nil, err
	}
	defer lock.Release(context.WithoutCancel(ctx))
	ctx, cancel := lock.Context(ctx)
	defer cancel()
	n, ok := a.m.Node(node)
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownNode, node)
	}
	if len(a.hist) == 0 {
		return nil, nil
	}
	nr := a.bringUp(ctx, n, a.hist[len(a.hist)-1].Seq)
	if nr.State != topo.SchemaApplied {
		return &nr, hint.New(fmt.Errorf("bringing node %s in step with the schema history: %s: %s", node, nr.State, nr.Error), nr.Hint)
	}
	return &nr, nil
}

// duplicateObject reports whether err is PostgreSQL refusing to create
// something that exists (a table, schema, object, function, column).
func duplicateObject(err error) bool {
	switch sqlstate.Of(err) {
	case "42P07", "42P06", "42710", "42723", "42701", "42P04":
		return true
	}
	return false
}

// Required returns the ids of the nodes every change must reach
// (bucketmap.Map.LiveNodes), sorted.
func Required(m *bucketmap.Map) []string {
	var out []string
	for _, n := range m.LiveNodes() {
		out = append(out, string(n.ID))
	}
	slices.Sort(out)
	return out
}

// connect opens one connection to node n, the connecting bounded by
// timeout (the connection itself is not).
func connect(ctx context.Context, n bucketmap.Node, timeout time.Duration) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return dbnode.Connect(cctx, n)
}
