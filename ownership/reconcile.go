package ownership

import (
	"context"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
)

// Reconcile repairs drift once: it reads the current map and brings the
// fences of the given nodes (all, if none) in step with it
// (fence.Reconcile, with its errors).
func Reconcile(ctx context.Context, st *bucketmap.Store, ids []bucketmap.NodeID, log *zap.Logger) (*bucketmap.Map, []fence.NodeSync, error) {
	return fence.Reconcile(ctx, st, ids, log)
}

// Watch is the continuous reconciler (fence.Watch): it keeps every node's
// fence, down nodes included, in step with the newest map until ctx ends,
// so that changes made without this package, and drift a change reported,
// are repaired without anyone doing anything.
func Watch(ctx context.Context, st *bucketmap.Store, ids []bucketmap.NodeID, opt fence.WatchOptions) error {
	return fence.Watch(ctx, st, ids, opt)
}
