package topo

import (
	"fmt"
	"path"
	"slices"
	"time"
)

// MoveVersion is the newest move record format this build writes.
const MoveVersion = 1

// Move states, in order. A move ends done, aborted, rolled back (a
// rollback move gave the bucket back to its source), or failed (a record
// of a build without the reverse stream whose verification found a
// difference: it stays "in flight" for GC, which then never deletes the
// range's source rows, and the rebalancer stops).
//
// After teardown a move with a reverse stream (Reverse) enters reverse
// (the stream from the target back to the source starts), verify, and
// then reversible: the rollback window, in which `move rollback` gives the
// bucket back with every write made since the flip. completing drops the
// reverse stream (`move complete`, or the window's end), then done.
const (
	MovePrepare  = "prepare"
	MoveCopy     = "copy"
	MoveCatchup  = "catchup"
	MoveFence    = "fence"
	MoveBarrier  = "barrier"
	MoveFlip     = "flip"
	MoveTeardown = "teardown"
	MoveReverse  = "reverse"
	MoveVerify   = "verify"
	// MoveReversible is the rollback window.
	MoveReversible = "reversible"
	MoveCompleting = "completing"
	MoveDone       = "done"
	MoveAborting   = "aborting"
	MoveAborted    = "aborted"
	MoveRolledBack = "rolled_back"
	MoveFailed     = "failed"
)

// MoveStates are the move states, in order.
var MoveStates = []string{MovePrepare, MoveCopy, MoveCatchup, MoveFence, MoveBarrier, MoveFlip, MoveTeardown, MoveReverse,
	MoveVerify, MoveReversible, MoveCompleting, MoveDone, MoveAborting, MoveAborted, MoveRolledBack, MoveFailed}

// MoveStarts are the states a move record is created in: prepare for a
// move, catchup for a rollback move (it runs over the reverse stream of
// the move it rolls back, so it has nothing to prepare or copy).
var MoveStarts = []string{MovePrepare, MoveCatchup}

// MoveTransitions is every legal change of a move's state, from each state
// to the states it may enter next; a state not listed is final. The mover
// refuses any other change (CheckMoveTransition).
//
// Before the flip a move may abort (aborting); fence, barrier and flip
// are the write pause, in which barrier and flip are entered without a
// save and the flip's ZooKeeper transaction writes flip with the map.
// A move without a copy goes from prepare to fence and from fence to
// flip, and is done at its flip. After the flip it never rolls back: a
// move with a reverse stream ends rolled_back only by a rollback move's
// flip, from its window.
var MoveTransitions = map[string][]string{
	MovePrepare:    {MoveCopy, MoveFence, MoveAborting},
	MoveCopy:       {MoveCatchup, MoveAborting},
	MoveCatchup:    {MoveFence, MoveAborting},
	MoveFence:      {MoveBarrier, MoveFlip, MoveAborting},
	MoveBarrier:    {MoveFlip, MoveAborting},
	MoveFlip:       {MoveTeardown, MoveDone, MoveAborting},
	MoveTeardown:   {MoveReverse, MoveVerify},
	MoveReverse:    {MoveVerify},
	MoveVerify:     {MoveReversible, MoveDone, MoveFailed},
	MoveReversible: {MoveCompleting, MoveRolledBack, MoveDone, MoveFailed},
	MoveCompleting: {MoveDone},
	MoveAborting:   {MoveAborted},
	// `move abort --after-failure`.
	MoveFailed: {MoveAborted},
}

// MoveTransitionError is a change of a move's state that MoveTransitions
// does not allow.
type MoveTransitionError struct {
	From, To string
}

func (e *MoveTransitionError) Error() string {
	return "illegal move transition from " + e.From + " to " + e.To
}

// CheckMoveTransition returns a *MoveTransitionError unless a move in
// state from may enter state to.
func CheckMoveTransition(from, to string) error {
	if slices.Contains(MoveTransitions[from], to) {
		return nil
	}
	return &MoveTransitionError{From: from, To: to}
}

// MoveRecord is one bucket move's crash-safe state at Paths.Move(id). The
// mover writes it by compare-and-swap before each step, naming every
// publication, subscription and slot before creating it, so that a mover
// restarted at any point can resume or clean up. GC reads "bucket",
// "level" and "state".
type MoveRecord struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	Bucket  uint32 `json:"bucket"`
	Level   int    `json:"level"`
	Lo      int64  `json:"lo"` // key range, inclusive
	Hi      int64  `json:"hi"`
	Source  string `json:"source"`
	Target  string `json:"target"`
	State   string `json:"state"`
	NoCopy  bool   `json:"no_copy,omitempty"`

	Tables       []TableRecord `json:"tables,omitempty"`
	Publication  string        `json:"publication,omitempty"`
	Subscription string        `json:"subscription,omitempty"`
	Slot         string        `json:"slot,omitempty"`
	// SlotPending: the source was unreachable at teardown; its slot was
	// detached from the subscription and must be dropped when it is back.
	SlotPending bool `json:"slot_pending,omitempty"`

	// Reverse is the stream from the target back to the source that
	// keeps the old owner in step after the flip, for a rollback. Nil for
	// a move without one (no copy, a rollback move, an older record).
	Reverse *ReverseStream `json:"reverse,omitempty"`
	// RollbackOf names the move this one rolls back: its source is that
	// move's target, and it runs over that move's reverse stream (no
	// copy; its flip ends that move rolled_back).
	RollbackOf string `json:"rollback_of,omitempty"`

	// Servers are the incarnations (dbnode.Incarnation: system id,
	// timeline, address) of the source's and target's primaries when the
	// move began. A move that finds either changed before its flip (a
	// Patroni failover or switchover) aborts: PostgreSQL 15's replication
	// slots do not survive a failover, and a subscriber that fails over
	// may have confirmed changes its standby never received.
	Servers *MoveServers `json:"servers,omitempty"`

	StartVersion uint64 `json:"start_map_version"`
	FenceVersion uint64 `json:"fence_map_version,omitempty"` // the map that set it moving
	FlipVersion  uint64 `json:"flip_map_version,omitempty"`  // the map that gave it to target
	// FreezeStartedAt is saved just before the source's fence is asked to
	// freeze the range: the write pause starts no earlier. A mover that
	// dies inside the pause leaves it, so that whoever ends the pause
	// (a resume's rollback) records the real pause.
	FreezeStartedAt *time.Time `json:"freeze_started_at,omitempty"`
	// PauseEndedAt is when a rolled-back pause ended: the source's fence
	// owned the range again (or the freeze was found never to have taken
	// effect). A flipped move's pause ends with the flip (FlipVersion).
	PauseEndedAt *time.Time `json:"pause_ended_at,omitempty"`

	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	Steps     []MoveStep `json:"steps,omitempty"`
	Stats     MoveStats  `json:"stats"`
	Verify    *MoveCheck `json:"verify,omitempty"`
	Error     string     `json:"error,omitempty"`
	Runner    string     `json:"runner,omitempty"` // host-pid of the mover that last ran it
	// Stragglers are the members that had not applied the fence map when
	// the member wait ran out; the move went on without them (their
	// clients get fence refusals until they catch up), or, with
	// --on-straggler=abort, was aborted over them (Error says so).
	Stragglers []Straggler `json:"stragglers,omitempty"`
}

// ReverseStream is a move's way back: a publication of the range on the
// target, a slot there, and a subscription on the source. The names are
// in the record before anything is created.
type ReverseStream struct {
	Publication  string `json:"publication"`  // on the target
	Slot         string `json:"slot"`         // on the target
	Subscription string `json:"subscription"` // on the source
	// StartLSN is the target's WAL insert position inside the write
	// pause, once the forward apply had stopped; written by the flip's
	// transaction. The slot is advanced to it before the stream starts,
	// so that nothing the forward stream applied is sent back
	// (PostgreSQL 15 has no origin = none).
	StartLSN string `json:"start_lsn,omitempty"`
	// Enabled: the mover enabled the source's subscription (not that it
	// still runs: see Lost).
	Enabled bool `json:"enabled,omitempty"`
	// Window is the rollback window the move was started with; Until is
	// when it ends (set on entering reversible).
	WindowS float64    `json:"window_s"`
	Until   *time.Time `json:"until,omitempty"`
	// Rollback is the latest rollback move started over this stream.
	Rollback string `json:"rollback,omitempty"`
	// RollbackWanted says why the move is to be rolled back (an
	// operator asked, or verification found a difference): a rollback
	// that did not get through (its mover died before its flip) is
	// started again, by whoever resumes the move, until one does.
	RollbackWanted string `json:"rollback_wanted,omitempty"`
	// RollbackAttempts counts the rollback moves started; after
	// MaxRollbackAttempts that aborted, the move stops wanting one.
	RollbackAttempts int `json:"rollback_attempts,omitempty"`
	// SlotPending: the target was unreachable when the stream was
	// dropped; its slot was detached and is dropped when it answers.
	SlotPending bool `json:"slot_pending,omitempty"`
	// Lost says why the stream ended before its window did (the target's
	// slot was gone: a failover of the target; found by the mover, or in
	// the window by the orphan watcher's probe of the servers, which then
	// ends the window at once); no rollback is possible. Enabled says
	// nothing of the stream's health: read it from the servers
	// (migrate.Mover.ProbeReverse).
	Lost string `json:"lost,omitempty"`
}

// Straggler is one member that had not applied a map version in time.
type Straggler struct {
	Member     string `json:"member"`          // its record's path
	MapVersion uint64 `json:"map_version"`     // the version it had applied
	Error      string `json:"error,omitempty"` // its record did not decode, was not read yet, or vanished (fleet.Gone)
}

// MoveServers are the two primaries a move started on.
type MoveServers struct {
	Source string `json:"source,omitempty"`
	Target string `json:"target"`
}

// MoveStep records when a state began.
type MoveStep struct {
	State string    `json:"state"`
	At    time.Time `json:"at"`
}

// MoveStats are the figures of one move.
type MoveStats struct {
	RowsCopied   int64   `json:"rows_copied"`
	CopyMS       float64 `json:"copy_ms"`
	LagAtFenceMS float64 `json:"lag_at_fence_ms"`
	PauseMS      float64 `json:"pause_ms"` // fence (source frozen) to flip (map gives the bucket to target)
	// MemberWaitMS is how long the mover waited for members to apply the
	// fence map (bounded by --member-wait).
	MemberWaitMS float64 `json:"member_wait_ms,omitempty"`
	// TotalMS is the move's wall time, from its record's creation to its
	// end (done, aborted, rolled back); 0 while it runs.
	TotalMS float64 `json:"total_ms,omitempty"`
	// Phases is where the move's time went (MovePhases' order), summed
	// over its runs; what no phase covers is the mover's own bookkeeping
	// and, for a resumed move, the time nobody ran it.
	Phases []PhaseTime `json:"phases,omitempty"`
}

// MoveCheck compares the range on both nodes after the flip.
type MoveCheck struct {
	// Chunks are the key ranges of a table whose rows differ (at most a
	// few per table), with what differs in them.
	Chunks []ChunkCheck `json:"chunks,omitempty"`
	OK     bool         `json:"ok"`
	// Inconclusive: the mover restarted after the flip, so the target's
	// snapshot at the flip is gone and new writes make a comparison
	// meaningless; nothing was found wrong.
	Inconclusive bool         `json:"inconclusive,omitempty"`
	Tables       []TableCheck `json:"tables"`
}

// TableCheck is one table's row count and order-independent checksum on
// both nodes.
type TableCheck struct {
	Table      string `json:"table"`
	SourceRows int64  `json:"source_rows"`
	TargetRows int64  `json:"target_rows"`
	SourceSum  string `json:"source_sum"`
	TargetSum  string `json:"target_sum"`
}

// ChunkCheck is one chunk of a table's range whose rows differ between
// the nodes: its key range, its rows on each node, and the first rows
// that differ (by primary key), when the chunk was small enough to list.
type ChunkCheck struct {
	Table      string   `json:"table"`
	Lo         int64    `json:"lo"`
	Hi         int64    `json:"hi"`
	SourceRows int64    `json:"source_rows"`
	TargetRows int64    `json:"target_rows"`
	Rows       []string `json:"rows,omitempty"` // e.g. "missing on target: {\"id\": 7, ...}"
}

// MoveStateFinal reports whether state ends a move: done or aborted. This
// is the one definition of "no longer in flight": failed is not final (its
// source rows stay for an operator), and neither is a state this build does
// not know.
func MoveStateFinal(state string) bool {
	return state == MoveDone || state == MoveAborted || state == MoveRolledBack
}

// MoveStateKnown reports whether state is one of the move states above.
func MoveStateKnown(state string) bool {
	switch state {
	case MovePrepare, MoveCopy, MoveCatchup, MoveFence, MoveBarrier, MoveFlip,
		MoveTeardown, MoveReverse, MoveVerify, MoveReversible, MoveCompleting, MoveDone,
		MoveAborting, MoveAborted, MoveRolledBack, MoveFailed:
		return true
	}
	return false
}

// Finished reports whether the move is over (done or aborted).
func (r *MoveRecord) Finished() bool { return MoveStateFinal(r.State) }

// DecodeMove decodes a move record.
func DecodeMove(znode string, data []byte) (*MoveRecord, error) {
	return decodeAs[MoveRecord]("move record", znode, data, MoveVersion, nil)
}

// MoveRunner is the ephemeral node a mover holds while it runs a move, so
// that two movers never run the same one.
func (p Paths) MoveRunner(id string) string { return path.Join(p.Move(id), "runner") }

// Rebalance holds the rebalancer's state record (paused or not, and why).
func (p Paths) Rebalance() string { return path.Join(p.Cluster(), "rebalance") }

// RebalanceVersion is the rebalance record format.
const RebalanceVersion = 1

// RebalanceRecord says whether the rebalancer may run.
type RebalanceRecord struct {
	Version int       `json:"version"`
	Paused  bool      `json:"paused"`
	Reason  string    `json:"reason,omitempty"`
	Move    string    `json:"move,omitempty"` // the move that caused the pause
	At      time.Time `json:"at"`
	// By is what the cluster balances (Mode reads it): "" or "count"
	// (bucket counts, the planner from the map alone), "size" or "rows"
	// (measured sizes; "bytes" is size's name in records written before
	// the names were made one). Set only by `shardctl rebalance mode` or
	// `rebalance --by X --set-mode`. A rebalancer by count, --watch
	// included, does not undo a balance by size.
	By string `json:"by,omitempty"`
	// BySetBy and BySetAt say who set By, and when (absent in records
	// written before they were kept). Pause and resume keep them.
	BySetBy string     `json:"by_set_by,omitempty"`
	BySetAt *time.Time `json:"by_set_at,omitempty"`
}

// The balance modes (RebalanceRecord.By), by the names the CLI takes.
const (
	BalanceCount = "count"
	BalanceSize  = "size"
	BalanceRows  = "rows"
)

// BalanceModes lists the balance modes, for messages.
const BalanceModes = "count, size or rows"

// ParseBalanceMode reads a balance mode: "" is count, and "bytes" (size's
// old name, in older records) is size.
func ParseBalanceMode(s string) (string, error) {
	switch s {
	case "", BalanceCount:
		return BalanceCount, nil
	case BalanceSize, "bytes":
		return BalanceSize, nil
	case BalanceRows:
		return BalanceRows, nil
	}
	return "", fmt.Errorf("balance mode %q is not %s", s, BalanceModes)
}

// Mode is what the cluster balances by r (count without a record). A
// mode this version does not know reads as itself, so that it is shown,
// and a rebalancer by count does not take it for count.
func (r *RebalanceRecord) Mode() string {
	if r == nil {
		return BalanceCount
	}
	m, err := ParseBalanceMode(r.By)
	if err != nil {
		return r.By
	}
	return m
}

// DecodeRebalance decodes a rebalance record.
func DecodeRebalance(znode string, data []byte) (*RebalanceRecord, error) {
	return decodeAs[RebalanceRecord]("rebalance record", znode, data, RebalanceVersion, nil)
}
