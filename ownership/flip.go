package ownership

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/zksession"
)

// A move's flip is the one ownership change that does not end with
// SyncAfter. The mover makes it in two halves, with its own steps in
// between:
//
//  1. Flip: the map gives the bucket in the move's write pause to the
//     target, in one ZooKeeper transaction with the move record's update
//     (also), so that the record says the flip happened exactly when the
//     map does;
//  2. SettleFlip, called by the mover after Flip succeeded (and again when
//     a move is resumed past its flip): the target's fence owns the range
//     and the source's releases it, both at exactly the flip's map version.
//
// SettleFlip changes one range, on connections the mover holds: the fence
// sync after other changes (SyncAfter) brings whole nodes to a map, which
// here would also freeze the ranges of other moves in flight before their
// own steps do.

// Flip names a move's flip.
type Flip struct {
	Move   string // the move's id: the bucket must be moving in this move
	Bucket bucketmap.Bucket
	Target bucketmap.NodeID
	NoCopy bool // the move copies no rows (bucketmap.AssignOptions.NoCopy)
}

// FlipMap is the map half of a move's flip: by compare-and-swap on base
// (at znode version zv; bucketmap.Store.UpdateAlso, with its retries) it
// assigns the bucket to the target, refusing if the bucket is no longer in
// this move's write pause, and writes also's operations in the same
// transaction. It brings no fence along: the mover calls SettleFlip after
// it. It returns what UpdateAlso returns.
func FlipMap(ctx context.Context, st *bucketmap.Store, base *bucketmap.Map, zv int32, f Flip, also func(next *bucketmap.Map) ([]zksession.Op, error)) (*bucketmap.Map, int32, []zksession.Stat, error) {
	return st.UpdateAlso(ctx, base, zv, func(m *bucketmap.Map) error {
		if !m.Has(f.Bucket) {
			return fmt.Errorf("bucket %s is no longer one of the map's buckets", f.Bucket)
		}
		if bm := m.MetaOf(f.Bucket); bm.State != bucketmap.BucketMoving || bm.Move != f.Move {
			return fmt.Errorf("bucket %s is no longer in this move's write pause (state %s, move %q)", f.Bucket, bm.State, bm.Move)
		}
		return m.Assign(f.Bucket, f.Target, bucketmap.AssignOptions{NoCopy: f.NoCopy})
	}, also)
}

// FlipFences is the fence half of a move's flip.
type FlipFences struct {
	Move    string
	Lo, Hi  int64  // the bucket's key range
	Version uint64 // the flip's map version
	// TargetOwned: the target's fence already owns the range at Version
	// (the mover committed exactly that in its flip).
	TargetOwned bool
	Target      func(ctx context.Context) (fence.DB, error)
	Source      func(ctx context.Context) (fence.DB, error)
	Logger      *zap.Logger // nil: no logs
}

// SettleFlip brings both fences of a flipped move to the flip's map
// version: the target owns the range (unless f.TargetOwned), then the
// source releases it. The target must own the range, or its writes are
// refused: that is the error, and targetOwned false. An unreachable
// source, or one that does not release, is logged and left to the
// reconciler (`shardctl node reconcile`, Watch): its fence keeps freezing
// the range until then. A fence already past the version (fence.ErrStale)
// is fine.
func SettleFlip(ctx context.Context, f FlipFences) (targetOwned bool, err error) {
	log := f.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if !f.TargetOwned {
		dst, err := f.Target(ctx)
		if err != nil {
			return false, fmt.Errorf("target fence (it must own the bucket now): %w", err)
		}
		if _, err := fence.Own(ctx, dst, f.Lo, f.Hi, f.Version); err != nil && !errors.Is(err, fence.ErrStale) {
			return false, fmt.Errorf("target fence (it must own the bucket now): %w", err)
		}
	}
	if src, err := f.Source(ctx); err == nil {
		if _, err := fence.Release(ctx, src, f.Lo, f.Hi, f.Version); err != nil && !errors.Is(err, fence.ErrStale) {
			log.Warn("source fence not released; `shardctl node reconcile` will", zap.String("move", f.Move), zap.Error(err))
		}
	} else {
		log.Warn("source unreachable after the flip; its fence still freezes the range until `shardctl node reconcile`", zap.String("move", f.Move), zap.Error(err))
	}
	return true, nil
}
