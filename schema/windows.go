package schema

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/topo"
)

// Moves in their rollback window and schema changes (see streamsafe.go):
// a change every statement of which a reverse stream carries runs while
// windows are open, on the streams' subscribers (the moves' old owners)
// before their publishers (the new owners), and checks each stream
// afterwards. Any other change closes the windows first
// (Options.CloseWindow) or waits for them to end.

// WindowResult is what a change did beside one move's reverse stream.
type WindowResult struct {
	Move   string `json:"move"`
	Source string `json:"source"` // the stream's subscriber, changed first
	Target string `json:"target"` // its publisher
	// Stream: "running"; "enabled again, caught up" (an apply error had
	// stopped it: it was started again and applied everything the
	// publisher wrote until the check); "stopped: why" (it failed again,
	// or did not catch up within streamCatchUp); "lost: why"; "ended:
	// the move is STATE" (completed or rolled back meanwhile); or
	// "unchecked: why" (a node did not answer).
	Stream string `json:"stream"`
	// ApplyErrors is how many apply errors the subscription counted
	// while the change ran (pg_stat_subscription_stats).
	ApplyErrors int64 `json:"apply_errors"`
}

// inWindow: the move is in its rollback window.
func inWindow(rec *topo.MoveRecord) bool { return rec.State == topo.MoveReversible }

// streaming: the move's reverse stream is, by its record, one a change
// must keep running (a rollback's own record has none).
func streaming(rec *topo.MoveRecord) bool {
	rv := rec.Reverse
	return inWindow(rec) && rec.RollbackOf == "" && rv != nil && rv.Enabled && rv.Lost == ""
}

// publishers returns the nodes that publish a reverse stream of windows,
// each with the subscribers it feeds.
func publishers(windows []*topo.MoveRecord) map[string][]string {
	out := map[string][]string{}
	for _, w := range windows {
		if streaming(w) && !slices.Contains(out[w.Target], w.Source) {
			out[w.Target] = append(out[w.Target], w.Source)
		}
	}
	return out
}

// applyErrors reads a subscription's apply error count on its node (-1:
// the subscription is gone).
func applyErrors(ctx context.Context, c *pgx.Conn, sub string) (int64, error) {
	var n *int64
	err := c.QueryRow(ctx, `SELECT (SELECT s.apply_error_count FROM pg_stat_subscription_stats s
		JOIN pg_subscription p ON p.oid = s.subid
		WHERE p.subname = $1 AND p.subdbid = (SELECT oid FROM pg_database WHERE datname = current_database()))`, sub).Scan(&n)
	if err != nil {
		return 0, err
	}
	if n == nil {
		return -1, nil
	}
	return *n, nil
}

// windowErrors reads, before the change, each stream's apply error count.
func (a *applier) windowErrors(ctx context.Context) map[string]int64 {
	out := map[string]int64{}
	for _, w := range a.windows {
		if !streaming(w) {
			continue
		}
		n, _ := a.m.Node(bucketmap.NodeID(w.Source))
		c, err := connect(ctx, n, a.opt.ConnectTimeout)
		if err != nil {
			continue
		}
		if v, err := applyErrors(ctx, c, w.Reverse.Subscription); err == nil {
			out[w.ID] = v
		}
		c.Close(context.WithoutCancel(ctx))
	}
	return out
}

// checkWindows checks each stream once the change ran: the subscription
// there and enabled (an apply error disables it, and the change, now on
// both ends, no longer makes one: it is enabled again), the publisher's
// slot there and not invalidated.
func (a *applier) checkWindows(ctx context.Context, before map[string]int64) []WindowResult {
	var out []WindowResult
	for _, w := range a.windows {
		if !streaming(w) {
			continue
		}
		r := WindowResult{Move: w.ID, Source: w.Source, Target: w.Target}
		if now, _, err := topo.ReadMove(ctx, a.s, a.p, w.ID); err == nil && !inWindow(now) {
			r.Stream = "ended: the move is " + now.State
		} else {
			r.Stream, r.ApplyErrors = a.checkStream(ctx, w, before)
		}
		msg := fmt.Sprintf("the reverse stream of move %s (%s -> %s): %s", w.ID, w.Target, w.Source, r.Stream)
		if r.ApplyErrors > 0 {
			msg += fmt.Sprintf(" (%d apply errors during the change)", r.ApplyErrors)
		}
		a.opt.event(Event{Message: msg})
		out = append(out, r)
	}
	return out
}

func (a *applier) checkStream(ctx context.Context, w *topo.MoveRecord, before map[string]int64) (string, int64) {
	rv := w.Reverse
	tn, _ := a.m.Node(bucketmap.NodeID(w.Target))
	tc, err := connect(ctx, tn, a.opt.ConnectTimeout)
	if err != nil {
		return "unchecked: " + w.Target + ": " + err.Error(), 0
	}
	defer tc.Close(context.WithoutCancel(ctx))
	slot, err := dbnode.ReplicationSlot(ctx, tc, rv.Slot)
	if err != nil {
		return "unchecked: " + w.Target + ": " + err.Error(), 0
	}
	switch {
	case slot == nil:
		return fmt.Sprintf("lost: the reverse slot %s is gone from %s", rv.Slot, w.Target), 0
	case slot.WALStatus == "lost":
		return fmt.Sprintf("lost: the reverse slot %s on %s was invalidated", rv.Slot, w.Target), 0
	}
	sn, _ := a.m.Node(bucketmap.NodeID(w.Source))
	sc, err := connect(ctx, sn, a.opt.ConnectTimeout)
	if err != nil {
		return "unchecked: " + w.Source + ": " + err.Error(), 0
	}
	defer sc.Close(context.WithoutCancel(ctx))
	var errs int64
	if n, err := applyErrors(ctx, sc, rv.Subscription); err == nil && n >= 0 {
		if b, ok := before[w.ID]; ok && b >= 0 {
			errs = n - b
		}
	}
	enabled, err := dbnode.SubscriptionEnabled(ctx, sc, rv.Subscription)
	if err != nil {
		return "unchecked: " + w.Source + ": " + err.Error(), errs
	}
	switch {
	case enabled == nil:
		return fmt.Sprintf("lost: the reverse subscription %s is gone from %s", rv.Subscription, w.Source), errs
	case !*enabled:
		if _, err := sc.Exec(ctx, "ALTER SUBSCRIPTION "+pgx.Identifier{rv.Subscription}.Sanitize()+" ENABLE"); err != nil {
			return "unchecked: enabling the subscription on " + w.Source + ": " + err.Error(), errs
		}
		return caughtUp(ctx, sc, tc, rv), errs
	case errs > 0:
		// Started again by someone since it failed: it must carry
		// what the publisher wrote since.
		return caughtUp(ctx, sc, tc, rv), errs
	}
	return "running", errs
}

// streamCatchUp bounds the wait for a stream started again to apply what
// its publisher wrote (the apply worker confirms at least every
// wal_receiver_status_interval, 10 s by default).
const streamCatchUp = 30 * time.Second

// caughtUp waits until a stream started again has confirmed the
// publisher's WAL position of now, or has stopped again.
func caughtUp(ctx context.Context, sub, pub *pgx.Conn, rv *topo.ReverseStream) string {
	var lsn string
	if err := pub.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return "unchecked: " + err.Error()
	}
	deadline := time.Now().Add(streamCatchUp)
	for {
		enabled, err := dbnode.SubscriptionEnabled(ctx, sub, rv.Subscription)
		if err != nil {
			return "unchecked: " + err.Error()
		}
		if enabled == nil || !*enabled {
			return "stopped: an apply error stopped it again after it was enabled (see the old owner's log)"
		}
		var done *bool
		if err := pub.QueryRow(ctx, "SELECT (SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1)", rv.Slot, lsn).Scan(&done); err != nil {
			return "unchecked: " + err.Error()
		}
		if done != nil && *done {
			return "enabled again, caught up"
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("stopped: enabled again, but it did not confirm %s within %s", lsn, streamCatchUp)
		}
		select {
		case <-ctx.Done():
			return "unchecked: " + ctx.Err().Error()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// ErrReverseStream: the change ran, but a reverse stream beside it is
// stopped or lost: its move's way back is not there.
var ErrReverseStream = errors.New("a reverse stream of a move in its rollback window did not survive the change")

// streamsBroken returns ErrReverseStream naming the streams stopped or
// lost, or nil.
func streamsBroken(ws []WindowResult) error {
	var bad []string
	for _, w := range ws {
		if strings.HasPrefix(w.Stream, "stopped") || strings.HasPrefix(w.Stream, "lost") {
			bad = append(bad, fmt.Sprintf("move %s: %s", w.Move, w.Stream))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return hint.New(fmt.Errorf("%w: %s", ErrReverseStream, strings.Join(bad, "; ")),
		"see `shardctl move status ID`; a `rebalance --watch` ends the window of a stream that is lost; `shardctl move complete ID` ends it now")
}
