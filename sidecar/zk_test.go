package sidecar

import (
	"context"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

func session(t *testing.T, connect string, timeout time.Duration) *zksession.Session {
	return zktest.Session(t, zksession.Config{Connect: connect, SessionTimeout: timeout, OpTimeout: 2 * time.Second})
}

// cluster creates a cluster in the test's ZooKeeper root and returns an
// admin store for it.
func cluster(t *testing.T, z *testenv.ZK, nodes []bucketmap.Node, level int) *bucketmap.Store {
	t.Helper()
	st := bucketmap.NewStore(session(t, z.ConnectString, 0), topo.MustPaths(z.Root, "c1"))
	m, err := bucketmap.New(level, nodes, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rec := topo.ClusterRecord{Version: 1, Name: "c1", Seed: testSeed, CreatedAt: time.Now().UTC()}
	if err := st.Create(context.Background(), rec, m, bucketmap.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return st
}

func waitVersion(t *testing.T, r *router.Router, v uint64) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if m := r.Map(); m != nil && m.Version >= v {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("router never applied map version %d (has %v)", v, r.Map())
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
