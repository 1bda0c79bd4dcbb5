package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// env is the environment bench/failover/run started (scripts/devenv),
// driven in this process, and its Patroni group.
type env struct {
	zk, dsn, pwFile, scope, ns string
	apiPorts                   []int
	devenv                     *devenv.Env
}

func readEnv() (*env, error) {
	cfg, err := devenv.FromEnv()
	if err != nil {
		return nil, err
	}
	cfg.Log = nil // its errors carry the servers' log tails
	d := devenv.New(cfg)
	if !d.IsGroup(*node) {
		return nil, fmt.Errorf("db node %d in %s is not a Patroni group: run it through bench/failover/run", *node, d.Dir())
	}
	// The registry takes a reference to the password, not the password.
	dsn := strings.Replace(d.NodeDSN(*node), ":"+d.Password()+"@", "@", 1)
	return &env{zk: d.ZKConnect(), dsn: dsn, pwFile: d.PasswordFile(), scope: fmt.Sprintf("pg%d", *node), ns: devenv.PatroniNamespace,
		apiPorts: []int{d.MemberAPIPort(*node, 1), d.MemberAPIPort(*node, 2)}, devenv: d}, nil
}

// setMode turns synchronous_mode on or off through Patroni's REST API
// (PATCH /config, which any member accepts) and waits for the group to
// be whole in that mode.
func setMode(ctx context.Context, p *benchkit.Printer, e *env, s *zksession.Session, mode string) error {
	on := mode == "sync"
	var last error
	for _, port := range e.apiPorts {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPatch, fmt.Sprintf("http://127.0.0.1:%d/config", port), strings.NewReader(fmt.Sprintf(`{"synchronous_mode": %v}`, on)))
		res, err := http.DefaultClient.Do(req)
		if last = err; err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				break
			}
			last = fmt.Errorf("PATCH /config: %s", res.Status)
		}
	}
	if last != nil {
		return last
	}
	p.Say("mode %s: synchronous_mode %v", mode, on)
	_, err := waitWhole(ctx, e, s, on, 2*time.Minute)
	return err
}

// waitWhole waits until the group has a leader and the other member runs
// (and, in sync mode, is the synchronous standby).
func waitWhole(ctx context.Context, e *env, s *zksession.Session, sync bool, timeout time.Duration) (*topo.PatroniGroup, error) {
	notReady := func(m topo.PatroniMember) bool {
		return !m.Leader && (m.State != "running" && m.State != "streaming" || sync && !m.Sync)
	}
	for deadline := time.Now().Add(timeout); ; {
		g, err := topo.ReadPatroni(ctx, s, e.ns, e.scope)
		if err == nil && g.Leader != "" && len(g.Members) == 2 && g.Config != nil && g.Config.SynchronousMode == sync && !slices.ContainsFunc(g.Members, notReady) {
			return g, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("group %s not whole after %s (sync=%v): %+v %v", e.scope, timeout, sync, g, err)
		}
		if err := benchkit.Sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
}
