package sidecar

import (
	"context"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/pooler"
)

// PoolView is a pooled node's poolers as GET /v1/status and the metrics
// show them: what each pooler's admin console says now (clients, waiting
// clients, server connections, limits), or why it did not answer.
type PoolView = pooler.NodeView

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
		return pooler.ReadAll(context.Background(), m, 3*time.Second)
	}}
}
