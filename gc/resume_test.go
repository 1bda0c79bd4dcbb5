package gc

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// childConfig is what a GC child process (see TestMain) runs.
type childConfig struct {
	ZK, Root, Cluster string
	Batch             int
	Rate              float64
}

const childEnv = "SHARDVISOR_GC_TEST_CHILD"

// TestMain runs a GC as a separate process when asked, so that a test can
// kill -9 it mid-run.
func TestMain(m *testing.M) {
	if cfg := os.Getenv(childEnv); cfg != "" {
		if err := runChild(cfg); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runChild(cfgJSON string) error {
	var cfg childConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		return err
	}
	s, err := zksession.Open(zksession.Config{Connect: cfg.ZK, SessionTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.WaitConnected(ctx); err != nil {
		return err
	}
	p := topo.MustPaths(cfg.Root, cfg.Cluster)
	rec, err := topo.ReadCluster(ctx, s, p)
	if err != nil {
		return err
	}
	// Run takes the GC lock itself.
	g := &GC{Session: s, Store: bucketmap.NewStore(s, p), Tables: rec.Tables, Opt: Options{Grace: -1, Batch: cfg.Batch, Rate: cfg.Rate}}
	_, err = g.Run(ctx)
	return err
}

// A GC killed with SIGKILL half-way loses nothing and the next run
// finishes the job; its lock dies with its session.
func TestIntegrationGCResumesAfterKill(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2, 2)
	r := rand.New(rand.NewPCG(11, 12))
	m := c.load()
	c.insert(r, m, 0, 20000)
	c.insert(r, m, 3, 500)
	from := m.Owner(0)
	m = c.move(m, 0, m.Owner(3))
	to := m.Owner(0)
	left := func() int64 { return c.counts(from, m.Level)[0] }
	if left() != 20000 || c.counts(to, m.Level)[0] != 20000 {
		t.Fatal("setup")
	}
	cfg, _ := json.Marshal(childConfig{ZK: c.z.ConnectString, Root: c.z.Root, Cluster: "c1", Batch: 100, Rate: 2000})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(cfg))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	testenv.WaitFor(t, 60*time.Second, func() bool { return left() < 19000 }, "the child GC to delete some rows")
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	if n := len(c.load().History()); n != 1 {
		t.Fatalf("history pruned by a killed run: %d entries", n)
	}
	// The dead holder's lock goes with its session.
	ctx := context.Background()
	var l *Lock
	testenv.WaitFor(t, 30*time.Second, func() bool {
		var err error
		l, err = Acquire(ctx, c.s, c.st.Paths())
		return err == nil
	}, "the killed GC's lock to expire")
	// Counted only now: a DELETE the child sent before the kill still
	// commits on the server after the kill (it read 18,901 left, then the
	// resumed run found 18,744); the session's expiry is seconds later.
	mid := left()
	if mid == 0 || mid >= 19000 {
		t.Fatalf("killed with %d rows left", mid)
	}
	// Run takes the lock itself: hand it over.
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rep := c.run(Options{Grace: -1, Batch: 1000})
	if rep.Deleted != mid || left() != 0 || rep.Pruned != 1 || len(c.load().History()) != 0 {
		t.Fatalf("resumed run deleted %d of %d, %d left, pruned %d", rep.Deleted, mid, left(), rep.Pruned)
	}
	if got := c.counts(to, m.Level)[0]; got != 20000 {
		t.Fatalf("the owner has %d rows", got)
	}
}
