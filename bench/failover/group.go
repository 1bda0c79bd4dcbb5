package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// env is the environment bench/failover/run started (scripts/devenv),
// driven in this process, and its Patroni group.
type env struct {
	zk, dsn, pwFile, scope, ns string
	devenv                     *devenv.Env
}

func readEnv(d *devenv.Env) (*env, error) {
	if !d.IsGroup(*node) {
		return nil, fmt.Errorf("db node %d in %s is not a Patroni group: run it through bench/failover/run", *node, d.Dir())
	}
	// The registry takes a reference to the password, not the password.
	dsn := strings.Replace(d.NodeDSN(*node), ":"+d.Password()+"@", "@", 1)
	return &env{zk: d.ZKConnect(), dsn: dsn, pwFile: d.PasswordFile(), scope: fmt.Sprintf("pg%d", *node), ns: devenv.PatroniNamespace, devenv: d}, nil
}

// session opens a session as identity (plain TCP unless the environment
// is TLS) with the bench's 4 s timeout.
func (e *env) session(ctx context.Context, identity string) (*zksession.Session, error) {
	cfg, err := clustertest.DevTLS(zksession.Config{Connect: e.zk, SessionTimeout: 4 * time.Second}, e.devenv.Dir(), e.devenv.Config().TLS, identity)
	if err != nil {
		return nil, err
	}
	return clustertest.OpenSessionWith(ctx, cfg, "bench/failover/run")
}

// setMode turns synchronous_mode on or off and waits for the group to be
// whole in that mode.
func setMode(ctx context.Context, p *benchkit.Printer, e *env, s *zksession.Session, mode string) error {
	if err := clustertest.SetSynchronousMode(ctx, e.devenv, *node, mode == "sync"); err != nil {
		return err
	}
	p.Say("mode %s: synchronous_mode %v", mode, mode == "sync")
	_, err := waitWhole(ctx, e, s, mode == "sync", 2*time.Minute)
	return err
}

// waitWhole waits until the group has a leader and the other member runs
// (and, in sync mode, is the synchronous standby).
func waitWhole(ctx context.Context, e *env, s *zksession.Session, sync bool, timeout time.Duration) (*topo.PatroniGroup, error) {
	return clustertest.WaitPatroniWhole(ctx, s, e.ns, e.scope, 2, sync, timeout)
}
