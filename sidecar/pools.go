package sidecar

import (
	"context"
	"sync"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/pooler"
)

// PoolView is a pooled node's poolers as GET /v1/status and the metrics
// show them: what each pooler's admin console says now (clients, waiting
// clients, server connections, limits), or why it did not answer.
type PoolView struct {
	pooler.NodeStats
	Error string `json:"error,omitempty"`
}

// poolsMaxAge bounds how old a pool view may be. Each read logs into
// every pooler's admin console (a SCRAM exchange, which PgBouncer works
// out on its one thread): once per 10 s per sidecar keeps a fleet of 50
// at 5 logins a second per pooler.
const poolsMaxAge = 10 * time.Second

type poolCache = nodeCache[PoolView]

// newPoolCache reads the poolers of the map's pooled nodes, all at once,
// with the node's password reference as the router does.
func newPoolCache() *poolCache {
	return &poolCache{maxAge: poolsMaxAge, read: func(m *bucketmap.Map) map[bucketmap.NodeID]*PoolView {
		out := map[bucketmap.NodeID]*PoolView{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, n := range m.Nodes() {
			if !n.Pooled() || n.State == bucketmap.NodeRemoved {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				st, err := pooler.ReadNode(ctx, n)
				v := &PoolView{NodeStats: st}
				if err != nil {
					v.Error = err.Error()
				}
				mu.Lock()
				out[n.ID] = v
				mu.Unlock()
			}()
		}
		wg.Wait()
		return out
	}}
}
