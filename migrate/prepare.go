package migrate

// The prepare step: the move checked (the map, Patroni groups, the
// schemas) and the target readied, then the schema gate into copy.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/topo"
)

// prepare checks the move and readies the target, then enters its first
// data state through the schema gate (topo.EnterMoveData): while a schema
// change runs, the move waits here, and checks again once it is over, so
// that a move never copies between nodes a change has reached one of.
func (r *run) prepare(ctx context.Context) error {
	r.crashHook(topo.MovePrepare) // the record exists, nothing else yet
	for {
		if err := r.waitSchema(ctx); err != nil {
			return err
		}
		// Read before the schemas are compared: a change that begins
		// after this fails the gate, and the move compares again.
		epoch, err := topo.ReadSchemaEpoch(ctx, r.mv.s, r.mv.p)
		if err != nil {
			return err
		}
		r.schemaEpoch = epoch
		err = r.prepareOnce(ctx)
		if !errors.Is(err, topo.ErrSchemaChanging) {
			return err
		}
		r.progress("a schema change ran during prepare: comparing the schemas again")
	}
}

// waitSchema waits while a schema change holds the schema lock.
func (r *run) waitSchema(ctx context.Context) error {
	var said time.Time
	for {
		holder, busy, err := topo.SchemaChanging(ctx, r.mv.s, r.mv.p)
		if err != nil || !busy {
			return err
		}
		if time.Since(said) >= 5*time.Second {
			r.progress("waiting for the schema change of " + holder)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// enterData is enter for the move's first data state, through the schema
// gate: topo.ErrSchemaChanging, with nothing written, while a schema
// change runs.
func (r *run) enterData(ctx context.Context, state string) error {
	if err := checkTransition(r.rec, state); err != nil {
		return err
	}
	prev, steps := r.rec.State, len(r.rec.Steps)
	r.leaving(state)
	r.rec.State = state
	r.rec.Steps = append(r.rec.Steps, topo.MoveStep{State: state, At: time.Now().UTC()})
	r.rec.UpdatedAt = time.Now().UTC()
	r.rec.Runner = r.mv.runner
	saveStart := time.Now()
	ver, err := topo.EnterMoveData(ctx, r.mv.s, r.mv.p, r.rec, r.ver, r.schemaEpoch)
	r.saved(time.Since(saveStart))
	if err != nil {
		r.rec.State, r.rec.Steps = prev, r.rec.Steps[:steps]
		if errors.Is(err, topo.ErrSchemaChanging) {
			return err
		}
		return fmt.Errorf("saving move %s: %w", r.rec.ID, err)
	}
	r.ver = ver
	r.progress(state)
	r.crashHook(state)
	return nil
}

func (r *run) prepareOnce(ctx context.Context) error {
	m, err := r.nodes(ctx)
	if err != nil {
		return err
	}
	if err := r.checkPremises(m); err != nil {
		return err
	}
	if err := r.checkGroups(ctx); err != nil {
		return err
	}
	dst, err := r.target(ctx)
	if err != nil {
		return err
	}
	if !r.rec.NoCopy {
		src, err := r.source(ctx)
		if err != nil {
			return err
		}
		if err := ensureMarker(ctx, src); err != nil {
			return fmt.Errorf("source: %w", err)
		}
		if err := ensureMarker(ctx, dst); err != nil {
			return fmt.Errorf("target: %w", err)
		}
		mism, err := fence.CheckTables(ctx, dst, r.rec.Tables)
		if err != nil {
			return fmt.Errorf("target: %w", err)
		}
		if len(mism) > 0 {
			return hint.New(fmt.Errorf("target %s does not match the sharded-table contract: %s", r.rec.Target, mism[0].Message), "shardctl node check "+r.rec.Target)
		}
		// Before the target's range is marked incoming and cleared, and
		// long before any row is copied or the source frozen.
		if err := r.compareSchemas(ctx, src, dst); err != nil {
			return err
		}
	}
	var src *pgx.Conn
	if !r.rec.NoCopy {
		src = r.srcConn
	}
	if err := r.recordServers(ctx, src, dst); err != nil {
		return err
	}
	if err := r.markIncoming(ctx, dst, m); err != nil {
		return err
	}
	if n, err := clearRange(ctx, dst, r.rec.Tables, r.rec.Lo, r.rec.Hi); err != nil {
		return fmt.Errorf("target: %w", err)
	} else if n > 0 {
		r.mv.log.Warn("removed leftover rows from the target range", zap.String("move", r.rec.ID), zap.Int64("rows", n))
	}
	if r.rec.NoCopy {
		return r.enterData(ctx, topo.MoveFence)
	}
	if err := r.enterData(ctx, topo.MoveCopy); err != nil {
		return err
	}
	r.comparedHere = true
	return nil
}

// ignoreSlotsHint, with the node's name, says how to keep a group's
// logical slots.
const ignoreSlotsHint = "add ignore_slots: [{type: logical, plugin: pgoutput}] to the group's configuration; see shardctl node check "

// checkGroups refuses a move that a Patroni group's configuration would
// break, before anything is created: a source group that drops unknown
// logical slots (no ignore_slots for them) would drop the move's within
// seconds, and a target group not in synchronous mode could lose copied
// rows in a failover right after the flip (the barrier's sync point
// waits for synchronous standbys only).
func (r *run) checkGroups(ctx context.Context) error {
	if p := r.src.Patroni; !p.IsZero() && !r.rec.NoCopy {
		g, err := topo.ReadPatroni(ctx, r.mv.s, p.Namespace, p.Scope)
		if err != nil {
			return fmt.Errorf("source %s: %w", r.rec.Source, err)
		}
		if g.Config == nil || !topo.PatroniKeepsLogicalSlots(g.Config.IgnoreSlots) {
			return hint.New(fmt.Errorf("source %s is a Patroni group whose ignore_slots does not keep logical pgoutput slots: Patroni would drop the move's slot", r.rec.Source),
				ignoreSlotsHint+r.rec.Source)
		}
	}
	if p := r.dst.Patroni; !p.IsZero() {
		g, err := topo.ReadPatroni(ctx, r.mv.s, p.Namespace, p.Scope)
		if err != nil {
			return fmt.Errorf("target %s: %w", r.rec.Target, err)
		}
		if r.rec.Reverse != nil && (g.Config == nil || !topo.PatroniKeepsLogicalSlots(g.Config.IgnoreSlots)) {
			return hint.New(fmt.Errorf("target %s is a Patroni group whose ignore_slots does not keep logical pgoutput slots: Patroni would drop the move's reverse slot, and with it the way back", r.rec.Target),
				ignoreSlotsHint+r.rec.Target)
		}
		if g.Config == nil || !g.Config.SynchronousMode {
			return hint.New(fmt.Errorf("target %s is a Patroni group not in synchronous_mode: a failover right after the flip could lose copied rows", r.rec.Target),
				"set synchronous_mode: true in the group's configuration; see shardctl node check "+r.rec.Target)
		}
	}
	return nil
}

// checkPremises refuses a move that map m no longer allows: its bucket
// split, or owned by another node than its source.
func (r *run) checkPremises(m *bucketmap.Map) error {
	if err := m.Check(recBucket(r.rec)); err != nil {
		return fmt.Errorf("the map was split before the move started copying: %w", err)
	}
	if owner := m.OwnerOf(recBucket(r.rec)); string(owner) != r.rec.Source {
		return fmt.Errorf("bucket %s is now owned by %s, not %s", recBucket(r.rec), owner, r.rec.Source)
	}
	return nil
}

// markIncomingAttempts bounds markIncoming's re-reads of the map.
const markIncomingAttempts = 5

// markIncoming marks the target's range incoming at the map version m,
// read at the start of prepare. The checks before it take seconds on a
// busy cluster, and any map change meanwhile (another move, a node
// added), once the target's fence has applied it, makes that version
// stale there: the fence refuses to go back (ErrStale). That used to
// abort the move. The map is read again instead, the move's premises
// checked again on it (the source still owns the bucket, which is not
// split), and the range marked at the newer version: a target-only change
// that the newer map does not contradict either.
func (r *run) markIncoming(ctx context.Context, dst *pgx.Conn, m *bucketmap.Map) error {
	if hook := r.mv.beforeMarkIncoming; hook != nil {
		hook()
	}
	for attempt := 1; ; attempt++ {
		_, err := fence.SetIncoming(ctx, dst, r.rec.Lo, r.rec.Hi, m.Version)
		if err == nil {
			return nil
		}
		if !errors.Is(err, fence.ErrStale) || attempt == markIncomingAttempts {
			return fmt.Errorf("target fence: %w", err)
		}
		stale := m.Version
		if m, err = r.nodes(ctx); err != nil {
			return err
		}
		if err := r.checkPremises(m); err != nil {
			return err
		}
		r.mv.log.Info("target fence: the map changed during prepare; marking the range incoming at the newer version",
			zap.String("move", r.rec.ID), zap.Uint64("stale_version", stale), zap.Uint64("map_version", m.Version))
	}
}
