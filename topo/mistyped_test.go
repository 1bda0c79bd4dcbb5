package topo

import (
	"errors"
	"testing"
)

// A record written under a cluster that does not exist (a mistyped
// --cluster on `rebalance --pause`, `pool set`, a runner lock) is refused
// naming `shardctl init`, and leaves no empty cluster znode that init would
// then refuse to overwrite.
func TestWritesUnderAMissingClusterLeaveNoCluster(t *testing.T) {
	ctx, _, s, p := zkCluster(t)
	if err := WriteRebalance(ctx, s, p, RebalanceRecord{Version: RebalanceVersion}); !errors.Is(err, ErrNoCluster) {
		t.Fatalf("rebalance record without a cluster: %v, want ErrNoCluster", err)
	}
	cfg := &PoolConfig{Version: PoolConfigVersion, Command: "/bin/true", Workers: 1}
	if _, _, err := SetPoolConfig(ctx, s, p, "web", cfg, -1); err != nil && !errors.Is(err, ErrNoCluster) {
		t.Fatalf("pool config without a cluster: %v, want ErrNoCluster", err)
	} else if err == nil {
		t.Fatal("pool config written without a cluster")
	}
	if _, err := LockGC(ctx, s, p, []byte("me")); !errors.Is(err, ErrNoCluster) {
		t.Fatalf("GC lock without a cluster: %v, want ErrNoCluster", err)
	}
	if ok, _, err := s.Exists(ctx, p.Cluster()); err != nil || ok {
		t.Fatalf("cluster znode after refused writes: exists=%v err=%v", ok, err)
	}
	if err := CreateCluster(ctx, s, p, testCluster("c1"), []byte(`{}`), nil); err != nil {
		t.Fatalf("init after the refused writes: %v", err)
	}
}
