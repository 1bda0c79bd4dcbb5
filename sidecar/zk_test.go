package sidecar

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/zksession"
)

func session(t *testing.T, connect string, timeout time.Duration) *zksession.Session {
	return zktest.Session(t, zksession.Config{Connect: connect, SessionTimeout: timeout, OpTimeout: 2 * time.Second})
}

// cluster creates a cluster in the test's ZooKeeper root and returns an
// admin store for it.
func cluster(t *testing.T, z *testenv.ZK, nodes []bucketmap.Node, level int) *bucketmap.Store {
	return clustertest.Create(t, session(t, z.ConnectString, 0), z.Root, nodes, level)
}

func waitVersion(t *testing.T, r *router.Router, v uint64) {
	t.Helper()
	testenv.WaitFor(t, 15*time.Second, func() bool { m := r.Map(); return m != nil && m.Version >= v }, fmt.Sprintf("the router to apply map version %d", v))
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
