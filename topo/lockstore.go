package topo

import (
	"context"
	"path"

	"github.com/shardvisor/shardvisor/zksession"
)

// GCLock is the GC lock's ephemeral node: at most one GC runs per cluster.
func (p Paths) GCLock() string { return path.Join(p.Lock("gc"), "holder") }

// RebalanceLock is the elected rebalancer's ephemeral node.
func (p Paths) RebalanceLock() string { return p.Lock("rebalance") }

// LockGC takes the cluster's GC lock (Paths.GCLock) with holder as its
// content, or fails at once as zksession.TryLock does.
func LockGC(ctx context.Context, s *zksession.Session, p Paths, holder []byte) (*zksession.Lock, error) {
	return tryLock(ctx, s, p, p.GCLock(), holder)
}

// LockRebalance waits to be the cluster's elected rebalancer (the lock at
// Paths.RebalanceLock), calling onWait with each refusal, as
// zksession.Lock does.
func LockRebalance(ctx context.Context, s *zksession.Session, p Paths, holder []byte, onWait func(*zksession.LockedError)) (*zksession.Lock, error) {
	return waitLock(ctx, s, p, p.RebalanceLock(), holder, onWait)
}
