package topo

import "path"

// GCLock is the GC lock's ephemeral node: at most one GC runs per cluster.
func (p Paths) GCLock() string { return path.Join(p.Lock("gc"), "holder") }

// RebalanceLock is the elected rebalancer's ephemeral node.
func (p Paths) RebalanceLock() string { return p.Lock("rebalance") }
