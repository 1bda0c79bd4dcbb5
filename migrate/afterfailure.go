package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/topo"
)

// ErrOwnerHasFewerRows refuses AbortAfterFailure: the node the map names as
// the bucket's owner holds fewer rows of it than the other side of the
// move, so some rows may exist only on the node GC would delete them from.
var ErrOwnerHasFewerRows = errors.New("the bucket's owner holds fewer rows of it than the other node")

// AfterFailure is what AbortAfterFailure found and did.
type AfterFailure struct {
	Move string `json:"move"`
	// Owner is the node the map names as the bucket's owner: it holds the
	// truth (after a failed move, the target: it has taken writes since
	// the flip). Other is the move's other node, whose copy GC may delete.
	Owner      string `json:"owner"`
	Other      string `json:"other"`
	MapVersion uint64 `json:"map_version"`
	// Tables are the range's row counts and checksums on both nodes now
	// (Source and Target as in the move).
	Tables []topo.TableCheck `json:"tables"`
	// CopiesDiffer: some table's count or checksum differs between the
	// two nodes (expected if the owner took writes since the flip).
	CopiesDiffer bool     `json:"copies_differ"`
	Actions      []string `json:"actions"`
}

// AbortAfterFailure is the way out of a failed move (one that flipped and
// then failed, e.g. its verification found a difference). A failed move
// blocks GC of its range and `move resume` only repeats the failure. It:
//
//  1. takes the move's runner lock and refuses any state but failed;
//  2. reads the map: the bucket's owner there holds the truth (the
//     target, which has taken writes since the flip), unless it is in a
//     move again (refused);
//  3. drops what the move may have left: its subscription on the target,
//     its publication, slot and markers on the source;
//  4. counts and checksums the range on both nodes; if the owner has
//     fewer rows than the other node in any table it refuses
//     (ErrOwnerHasFewerRows, the move stays failed): those rows may exist
//     only on the node GC would delete them from;
//  5. brings both fences to the map: the owner owns the range, the other
//     node does not;
//  6. sets the record to aborted, with what it found added to its error.
//     GC then treats the range like any finished move's: after --grace,
//     and only while the owner has at least as many rows, it deletes the
//     other node's copy. A paused rebalancer stays paused.
func (mv *Mover) AbortAfterFailure(ctx context.Context, id string) (*topo.MoveRecord, *AfterFailure, error) {
	var rep *AfterFailure
	rec, err := mv.withRun(ctx, id, func(ctx context.Context, r *run) error {
		var err error
		rep, err = r.abortAfterFailure(ctx)
		return err
	})
	if err == nil && rec != nil && rep == nil {
		err = fmt.Errorf("move %s is %s, not failed: --after-failure is only for a failed move", id, rec.State)
	}
	return rec, rep, err
}

func (r *run) abortAfterFailure(ctx context.Context) (*AfterFailure, error) {
	id := r.rec.ID
	if r.rec.State != topo.MoveFailed {
		return nil, hint.New(fmt.Errorf("move %s is %s, not failed: --after-failure is only for a failed move", id, r.rec.State),
			fmt.Sprintf("a move before its flip: `shardctl move abort %s`; past it and not failed: `shardctl move resume %s`", id, id))
	}
	m, err := r.nodes(ctx)
	if err != nil {
		return nil, err
	}
	b := recBucket(r.rec)
	if err := m.Check(b); err != nil {
		return nil, fmt.Errorf("move %s: the map was split since (%v); compare the nodes by hand", id, err)
	}
	bm := m.MetaOf(b)
	if bm.State == bucketmap.BucketMoving {
		return nil, fmt.Errorf("bucket %s is in another move (%s) now; finish that first", b, bm.Move)
	}
	owner := string(m.OwnerOf(b))
	rep := &AfterFailure{Move: id, Owner: owner, MapVersion: m.Version}
	switch owner {
	case r.rec.Target:
		rep.Other = r.rec.Source
	case r.rec.Source:
		rep.Other = r.rec.Target
	default:
		return nil, fmt.Errorf("bucket %s is owned by %s now, neither the move's source %s nor its target %s; compare the nodes by hand", b, owner, r.rec.Source, r.rec.Target)
	}
	src, err := r.source(ctx)
	if err != nil {
		return nil, err
	}
	dst, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	// 3. Leftovers of the move (normally gone: a failed move has passed
	// its teardown).
	if r.rec.Subscription != "" {
		if err := dropSubscription(ctx, dst, r.rec.Subscription, true); err != nil {
			return nil, fmt.Errorf("target: dropping subscription: %w", err)
		}
	}
	if err := dropPublication(ctx, src, r.rec.Publication); err != nil {
		return nil, fmt.Errorf("source: dropping publication: %w", err)
	}
	if err := dropSlot(ctx, src, r.rec.Slot); err != nil {
		return nil, fmt.Errorf("source: dropping slot: %w", err)
	}
	r.rec.SlotPending = false
	_ = clearMarkers(ctx, src, id)
	_ = clearMarkers(ctx, dst, id)
	// 4. Which side has what.
	// The sums verification uses (verify.go), totals only.
	ss, err := rangeSums(ctx, src, r.rec.Tables, r.rec.Lo, r.rec.Hi, false)
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	ts, err := rangeSums(ctx, dst, r.rec.Tables, r.rec.Lo, r.rec.Hi, false)
	if err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	var fewer []string
	for i, t := range r.rec.Tables {
		a, b := ss[i], ts[i]
		rep.Tables = append(rep.Tables, topo.TableCheck{Table: t.Name, SourceRows: a.rows, TargetRows: b.rows, SourceSum: a.sum, TargetSum: b.sum})
		if a.rows != b.rows || a.sum != b.sum {
			rep.CopiesDiffer = true
		}
		ownerRows, otherRows := b.rows, a.rows
		if owner == r.rec.Source {
			ownerRows, otherRows = a.rows, b.rows
		}
		if ownerRows < otherRows {
			fewer = append(fewer, fmt.Sprintf("%s: %d rows on %s (owner), %d on %s", t.Name, ownerRows, owner, otherRows, rep.Other))
		}
	}
	if len(fewer) > 0 {
		r.mv.log.Warn("abort after failure refused: the owner holds fewer rows", zap.String("move", id), zap.Strings("tables", fewer))
		return rep, hint.New(fmt.Errorf("%w (%s); the move stays failed. Rows may exist only on %s", ErrOwnerHasFewerRows, strings.Join(fewer, "; "), rep.Other),
			fmt.Sprintf("copy the rows the application still needs from %s to %s (or delete them from %s if they were meant to go), then run `shardctl move abort %s --after-failure` again",
				rep.Other, owner, rep.Other, id))
	}
	// 5. Fences: the owner owns the range, the other node does not.
	ownerConn, otherConn := dst, src
	if owner == r.rec.Source {
		ownerConn, otherConn = src, dst
	}
	if _, err := fence.Own(ctx, ownerConn, r.rec.Lo, r.rec.Hi, m.Version); err != nil && !errors.Is(err, fence.ErrStale) {
		return rep, fmt.Errorf("%s fence: %w", owner, err)
	}
	if _, err := fence.Release(ctx, otherConn, r.rec.Lo, r.rec.Hi, m.Version); err != nil && !errors.Is(err, fence.ErrStale) {
		return rep, fmt.Errorf("%s fence: %w", rep.Other, err)
	}
	rep.Actions = append(rep.Actions,
		"replication objects of the move dropped (if any were left)",
		fmt.Sprintf("fences at map version %d: %s owns keys %d..%d, %s does not", m.Version, owner, r.rec.Lo, r.rec.Hi, rep.Other),
		"move record set to aborted: GC no longer treats the range as in flight")
	summary := fmt.Sprintf("aborted after failure: %s owns the bucket (map version %d) and holds at least as many rows in every table", owner, m.Version)
	if rep.CopiesDiffer {
		summary += fmt.Sprintf("; the copies differ (%s), and GC deletes %s's copy after its grace period", describeChecks(rep.Tables), rep.Other)
		rep.Actions = append(rep.Actions, fmt.Sprintf("WARNING: the copies differ; %s's copy is deleted by GC after --grace: save it first if it holds anything the owner lacks", rep.Other))
	}
	if r.rec.Error != "" {
		r.rec.Error += "; then " + summary
	} else {
		r.rec.Error = summary
	}
	if err := r.enter(ctx, topo.MoveAborted); err != nil {
		return rep, err
	}
	r.mv.log.Warn("failed move aborted after failure", zap.String("move", id), zap.String("owner", owner), zap.String("other", rep.Other),
		zap.Bool("copies_differ", rep.CopiesDiffer), zap.Uint64("map_version", m.Version))
	return rep, nil
}

func describeChecks(tables []topo.TableCheck) string {
	return describe(&topo.MoveCheck{Tables: tables})
}
