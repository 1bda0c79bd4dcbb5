package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// ZooKeeper mode, with an explicit --member: both supervisors of the
// upgrade want the same ephemeral member record. The new one gets it once
// the old one has drained and removed it. A second supervisor started
// meanwhile is refused and publishes nothing, whether it shares the state
// directory (the pool lock) or only the member name (the member record).
func TestUpgradeZooKeeperModeSameMember(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	connect := z.ConnectString + z.Root
	ss := zktest.Session(t, zksession.Config{Connect: connect})
	paths := topo.MustPaths("/shardvisor", "c1")
	e := newUpgradeEnv(t)
	cfgBytes, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := topo.DecodePoolConfig(e.config, cfgBytes)
	if err != nil {
		t.Fatal(err)
	}
	data, err := topo.EncodePoolConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ss.CreateAll(ctx, paths.Pool("upg")); err != nil {
		t.Fatal(err)
	}
	if err := ss.Create(ctx, paths.PoolConfig("upg"), data); err != nil {
		t.Fatal(err)
	}
	e.config = "" // ZooKeeper mode
	zkArgs := []string{"--zk", connect, "--cluster", "c1", "--pool", "upg", "--state-dir", e.stateDir, "--member", "m1", "--fail-static=false"}
	old := exec.Command(e.bin, append(zkArgs, "--admin", e.admin)...)
	old.Stdout, old.Stderr = e.log, e.log
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	oldDone := make(chan error, 1)
	go func() { oldDone <- old.Wait() }()
	e.waitServing(old.Process.Pid)
	member := func() *topo.PoolMember {
		b, _, err := ss.Get(ctx, paths.PoolMember("upg", "m1"))
		if err != nil {
			return nil
		}
		m, _ := topo.DecodePoolMember("", b)
		return m
	}
	e.waitFor(30*time.Second, "the member record of the old supervisor", func() bool { m := member(); return m != nil && m.PID == old.Process.Pid })
	var statusBefore []byte
	e.waitFor(30*time.Second, "the pool status record", func() bool {
		statusBefore, _, err = ss.Get(ctx, paths.PoolStatus("upg"))
		return err == nil
	})

	// A second supervisor of the pool on this host: refused before it
	// connects anything it could publish.
	var out bytes.Buffer
	second := exec.Command(e.bin, append(zkArgs[:len(zkArgs)-3], "--member", "m2", "--admin", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)))...)
	second.Stdout, second.Stderr = &out, &out
	err = second.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out.String(), "already supervised") {
		t.Errorf("second supervisor: %v, %s; want exit 1 and a refusal", err, out.String())
	}
	members, _, err := ss.Children(ctx, paths.PoolMembers("upg"))
	if err != nil || len(members) != 1 || members[0] != "m1" {
		t.Errorf("members after the refused start: %v, %v; want [m1]", members, err)
	}
	if b, _, _ := ss.Get(ctx, paths.PoolStatus("upg")); !bytes.Equal(b, statusBefore) {
		t.Errorf("the pool status record changed: %s -> %s", statusBefore, b)
	}

	// The same member name from another state directory: refused by the
	// member record, which another live session owns (issue 24).
	sameMemberRefused(t, e, ss, paths, append(zkArgs[:6:6], "--member", "m1", "--fail-static=false"), old.Process.Pid)
	if t.Failed() {
		return
	}

	l := startLoad(fmt.Sprintf("127.0.0.1:%d", e.port), e.admin, 4)
	l.waitMore(t, 200)
	e.upgradeOK(l, old, oldDone)
	newPid := e.lockHolder()
	e.waitFor(60*time.Second, "the new supervisor's member record", func() bool { m := member(); return m != nil && m.PID == newPid })
	l.finish(t)
	members, _, _ = ss.Children(ctx, paths.PoolMembers("upg"))
	if len(members) != 1 {
		t.Errorf("members after the upgrade: %v, want [m1]", members)
	}
	_ = syscall.Kill(newPid, syscall.SIGTERM)
	e.waitFor(60*time.Second, "the new supervisor to stop", func() bool { return !alive(newPid) })
	e.waitFor(30*time.Second, "its member record to go", func() bool { return member() == nil })
}
