package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/topo"
)

// A reverse stream's state as the servers have it, not as the move record
// last said: the record's Enabled only says that the mover once enabled
// the subscription, and a failover of the target (PostgreSQL 15's slots do
// not survive one) or an apply error ends the stream without telling
// anyone.

// Reverse stream states, as ProbeReverse reads them from the servers.
const (
	// ReverseRunning: the source's subscription is enabled and the
	// target's slot is there and not invalidated.
	ReverseRunning = "running"
	// ReverseDisabled: an apply error disabled the subscription
	// (disable_on_error); the slot is there, so the way back still
	// exists: a rollback enables it again and retries.
	ReverseDisabled = "disabled"
	// ReverseLost: the slot is gone (a failover of the target) or was
	// invalidated (max_slot_wal_keep_size), or the subscription is gone:
	// no rollback is possible.
	ReverseLost = "lost"
	// ReverseUnknown: a node did not answer; never taken for lost.
	ReverseUnknown = "unknown"
)

// reverseProbeTimeout bounds one probe (its connections and queries).
const reverseProbeTimeout = 5 * time.Second

// ReverseProbe is a move's reverse stream as read from the servers (the
// record the probing watcher publishes for the status page).
type ReverseProbe = topo.ReverseState

// reverseObs is what the two servers answered about a reverse stream.
type reverseObs struct {
	srcErr, dstErr error // the node did not answer
	subFound       bool
	subEnabled     bool
	slotFound      bool
	walStatus      string
	lag            *int64
}

// probed reports whether a move has a reverse stream whose state the
// servers tell: one started (enabled) and not yet being dropped.
func probed(rec *topo.MoveRecord) bool {
	rv := rec.Reverse
	if rv == nil || rec.RollbackOf != "" || !rv.Enabled || rv.Lost != "" {
		return false
	}
	switch rec.State {
	case topo.MoveReverse, topo.MoveVerify, topo.MoveReversible:
		return true
	}
	return false
}

// classifyReverse turns what the servers answered into a state. What one
// server answered decides "lost" even when the other did not answer: a
// gone slot or subscription never comes back. An unanswered question is
// never "lost".
func classifyReverse(rec *topo.MoveRecord, o reverseObs) ReverseProbe {
	rv := rec.Reverse
	p := ReverseProbe{WALStatus: o.walStatus, LagBytes: o.lag}
	switch {
	case o.dstErr == nil && !o.slotFound:
		p.State, p.Reason = ReverseLost, fmt.Sprintf("the reverse slot %s is gone from %s (a failover of the target?)", rv.Slot, rec.Target)
	case o.dstErr == nil && o.walStatus == "lost":
		p.State, p.Reason = ReverseLost, fmt.Sprintf("the reverse slot %s on %s was invalidated (max_slot_wal_keep_size)", rv.Slot, rec.Target)
	case o.srcErr == nil && !o.subFound:
		p.State, p.Reason = ReverseLost, fmt.Sprintf("the reverse subscription %s is gone from %s", rv.Subscription, rec.Source)
	case o.srcErr != nil:
		p.State, p.Reason = ReverseUnknown, fmt.Sprintf("source %s did not answer: %v", rec.Source, o.srcErr)
	case o.dstErr != nil:
		p.State, p.Reason = ReverseUnknown, fmt.Sprintf("target %s did not answer: %v", rec.Target, o.dstErr)
	case !o.subEnabled:
		p.State, p.Reason = ReverseDisabled, fmt.Sprintf("an apply error disabled the reverse subscription %s on %s (a rollback enables it again; its error is in %s's log)", rv.Subscription, rec.Source, rec.Source)
	default:
		p.State = ReverseRunning
		if o.walStatus == "unreserved" {
			p.Reason = fmt.Sprintf("the reverse slot %s on %s is about to be invalidated (max_slot_wal_keep_size): the source lags too far", rv.Slot, rec.Target)
		}
	}
	if p.State == ReverseLost {
		p.LagBytes = nil
	}
	return p
}

// ProbeReverse reads the state of a move's reverse stream from its two
// servers, read-only; nil for a move with no stream to probe (none, not
// started, ended, or recorded lost: the record says so). It takes no lock.
func (mv *Mover) ProbeReverse(ctx context.Context, rec *topo.MoveRecord) *ReverseProbe {
	if !probed(rec) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, reverseProbeTimeout)
	defer cancel()
	var o reverseObs
	m, _, err := mv.st.Load(ctx)
	if err != nil {
		o.srcErr, o.dstErr = err, err
	} else {
		src, srcOK := m.Node(bucketmap.NodeID(rec.Source))
		dst, dstOK := m.Node(bucketmap.NodeID(rec.Target))
		o.srcErr = connectProbe(ctx, src, srcOK, func(c *pgx.Conn) error { return probeSource(ctx, c, rec.Reverse, &o) })
		o.dstErr = connectProbe(ctx, dst, dstOK, func(c *pgx.Conn) error { return probeTarget(ctx, c, rec.Reverse, &o) })
	}
	p := classifyReverse(rec, o)
	p.At = time.Now().UTC()
	return &p
}

func connectProbe(ctx context.Context, n bucketmap.Node, ok bool, fn func(*pgx.Conn) error) error {
	if !ok {
		return errors.New("no longer in the registry")
	}
	c, err := dbnode.Connect(ctx, n)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	return fn(c)
}

// probeSource reads the subscriber's side: the subscription, enabled or
// not.
func probeSource(ctx context.Context, c *pgx.Conn, rv *topo.ReverseStream, o *reverseObs) error {
	enabled, err := dbnode.SubscriptionEnabled(ctx, c, rv.Subscription)
	if err != nil || enabled == nil {
		return err
	}
	o.subFound, o.subEnabled = true, *enabled
	return nil
}

// probeTarget reads the publisher's side: the slot, its wal_status, and
// how far its confirmed position is behind the target's WAL.
func probeTarget(ctx context.Context, c *pgx.Conn, rv *topo.ReverseStream, o *reverseObs) error {
	slot, err := dbnode.ReplicationSlot(ctx, c, rv.Slot)
	if err != nil || slot == nil {
		return err
	}
	o.slotFound, o.walStatus, o.lag = true, slot.WALStatus, slot.LagBytes
	return nil
}

// probeRun is ProbeReverse on a run's connections, under the move's lock.
func (r *run) probeRun(ctx context.Context) ReverseProbe {
	var o reverseObs
	if _, err := r.nodes(ctx); err != nil {
		o.srcErr, o.dstErr = err, err
	} else {
		if src, err := r.source(ctx); err != nil {
			o.srcErr = err
		} else {
			o.srcErr = probeSource(ctx, src, r.rec.Reverse, &o)
		}
		if dst, err := r.target(ctx); err != nil {
			o.dstErr = err
		} else {
			o.dstErr = probeTarget(ctx, dst, r.rec.Reverse, &o)
		}
	}
	p := classifyReverse(r.rec, o)
	p.At = time.Now().UTC()
	return p
}

// EndLostWindow ends, at once, the rollback window of a move whose reverse
// stream is lost (the watcher found it so): under the move's lock the
// stream is probed again, and only if it is lost is the reason recorded
// (ReverseStream.Lost) and the window ended as endWithoutWayBack does (a
// verified move is done on its target, one whose verification differs is
// failed for a person). A stream found otherwise is left alone. A rollback
// in flight is left to its own run.
func (mv *Mover) EndLostWindow(ctx context.Context, id string) (*topo.MoveRecord, error) {
	return mv.withRun(ctx, id, func(ctx context.Context, r *run) error {
		if r.rec.State != topo.MoveReversible || !canRollBack(r.rec) {
			return nil
		}
		if rv := r.rec.Reverse; rv.Rollback != "" {
			if rrec, _, err := topo.ReadMove(ctx, r.mv.s, r.mv.p, rv.Rollback); err == nil && !rrec.Finished() {
				return nil
			}
		}
		p := r.probeRun(ctx)
		if p.State != ReverseLost {
			return nil
		}
		err := r.endWithoutWayBack(ctx, p.Reason)
		if errors.Is(err, ErrNoRollback) && (r.rec.State == topo.MoveDone || r.rec.State == topo.MoveFailed) {
			// Ended as it should: the error only tells a caller who asked
			// for a rollback.
			return nil
		}
		return err
	})
}
