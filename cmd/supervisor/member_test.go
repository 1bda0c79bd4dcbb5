package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// One live supervisor per member name in a pool (issue 24, part 2).

type zkPool struct {
	*upgradeEnv
	ss     *zksession.Session
	paths  topo.Paths
	args   []string // ZooKeeper mode, pool "upg", member m1, no state dir or admin
	ctx    context.Context
	member string
}

func newZKPool(t *testing.T, extra ...string) *zkPool {
	z := testenv.StartZK(t)
	connect := z.ConnectString + z.Root
	e := &zkPool{upgradeEnv: newUpgradeEnv(t), ss: zktest.Session(t, zksession.Config{Connect: connect}),
		paths: topo.MustPaths("/shardvisor", "c1"), member: "m1"}
	cfgBytes, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := topo.DecodePoolConfig(e.config, cfgBytes)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	e.ctx = ctx
	if _, _, err := topo.SetPoolConfig(ctx, e.ss, e.paths, "upg", cfg, -1); err != nil {
		t.Fatal(err)
	}
	e.config = ""
	e.args = append([]string{"--zk", connect, "--cluster", "c1", "--pool", "upg", "--member", e.member, "--fail-static=false"}, extra...)
	return e
}

// run starts a supervisor with the pool's arguments plus extra.
func (e *zkPool) run(out *os.File, extra ...string) (*exec.Cmd, chan error) {
	e.t.Helper()
	cmd := exec.Command(e.bin, append(append([]string{}, e.args...), extra...)...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, done
}

// holder is the member record and the session that owns it.
func (e *zkPool) holder() *topo.PoolMemberHolder {
	h, err := topo.ReadPoolMemberHolder(e.ctx, e.ss, e.paths, "upg", e.member)
	if err != nil {
		return nil
	}
	return h
}

// sameMemberRefused is the finding of issue 24: a second supervisor of the
// pool started with another state directory and the same member name was
// not caught by the pool lock, and its failed binds overwrote the pool
// status ("failed by rl2"). It is now refused before it binds or
// publishes anything, whatever its state directory, and the first one's
// records are untouched. zkArgs name the pool and member m1 of the
// serving supervisor firstPid (TestUpgradeZooKeeperModeSameMember runs
// it, with the supervisor it already has).
func sameMemberRefused(t *testing.T, e *upgradeEnv, ss *zksession.Session, paths topo.Paths, zkArgs []string, firstPid int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder := func() *topo.PoolMemberHolder {
		h, _ := topo.ReadPoolMemberHolder(ctx, ss, paths, "upg", "m1")
		return h
	}
	var before *topo.PoolMemberHolder
	e.waitFor(30*time.Second, "the first supervisor's member record", func() bool {
		before = holder()
		return before != nil && before.Rec != nil && before.Rec.PID == firstPid
	})
	status, _, err := ss.Get(ctx, paths.PoolStatus("upg"))
	if err != nil || len(status) == 0 {
		t.Fatalf("pool status: %q %v", status, err)
	}
	var out bytes.Buffer
	second := exec.Command(e.bin, append(append([]string{}, zkArgs...), "--state-dir", filepath.Join(e.dir, "other-state"),
		"--admin", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)))...)
	second.Stdout, second.Stderr = &out, &out
	done := make(chan error, 1)
	start := time.Now()
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- second.Wait() }()
	select {
	case err = <-done:
		t.Logf("the second supervisor with member m1 exited %s after its start: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(30 * time.Second):
		_ = second.Process.Kill()
		t.Fatal("the second supervisor did not exit: it must refuse")
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("second supervisor: %v, want exit status 1; output:\n%s", err, out.String())
	}
	for _, want := range []string{`member "m1" of pool "upg"`, fmt.Sprintf("pid %d", firstPid),
		fmt.Sprintf("session 0x%x", before.Owner), "pick another --member"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "listening") || strings.Contains(out.String(), "worker started") {
		t.Errorf("the refused supervisor bound or started something:\n%s", out.String())
	}
	after := holder()
	if after == nil || after.Owner != before.Owner || after.Rec == nil || after.Rec.PID != firstPid {
		t.Errorf("the member record changed hands: %+v -> %+v", before, after)
	}
	if b, _, _ := ss.Get(ctx, paths.PoolStatus("upg")); !bytes.Equal(b, status) {
		t.Errorf("the pool status record changed: %s -> %s", status, b)
	}
}

// A supervisor restarted right after a crash finds its previous run's
// record, still held by that run's session until the server expires it:
// it waits for the expiry (this host, a pid that no longer runs) instead
// of refusing, and then serves.
func TestFaultsCrashRestartWaitsForOldSession(t *testing.T) {
	testenv.Faults(t)
	e := newZKPool(t, "--zk-session-timeout", "2s")
	args := []string{"--state-dir", e.stateDir, "--admin", e.admin}
	first, firstDone := e.run(e.log, args...)
	e.waitServing(first.Process.Pid)
	e.waitFor(30*time.Second, "the first supervisor's member record", func() bool {
		h := e.holder()
		return h != nil && h.Rec != nil && h.Rec.PID == first.Process.Pid
	})
	old := e.holder().Owner
	_ = first.Process.Signal(syscall.SIGKILL)
	<-firstDone
	if h := e.holder(); h == nil || h.Owner != old {
		t.Skip("the old session expired before the restart: nothing to wait for")
	}
	second, secondDone := e.run(e.log, args...)
	e.waitServing(second.Process.Pid)
	h := e.holder()
	if h == nil || h.Owner == old || h.Rec == nil || h.Rec.PID != second.Process.Pid {
		t.Errorf("member record after the restart: %+v", h)
	}
	if !e.logged("waiting for ZooKeeper to expire that session") || !e.logged("expired; registered ours") {
		t.Error("the log does not say the restarted supervisor waited for its old session")
	}
	// Through its Wait, not ProcessState: the goroutine waiting for it
	// writes that (go test -race caught the test reading it).
	select {
	case err := <-secondDone:
		t.Errorf("the restarted supervisor exited: %v", err)
	default:
	}
}
