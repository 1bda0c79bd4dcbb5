package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// env is the environment bench/failover/run started (scripts/devenv env),
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
	n := strconv.Itoa(*node)
	e := &env{zk: os.Getenv("SHARDVISOR_ZK"), pwFile: os.Getenv("SHARDVISOR_PG_PASSWORD_FILE"), devenv: devenv.New(cfg),
		dsn: os.Getenv("SHARDVISOR_PG" + n + "_DSN"), scope: os.Getenv("SHARDVISOR_PG" + n + "_PATRONI_SCOPE"),
		ns: benchkit.EnvOr("SHARDVISOR_PG"+n+"_PATRONI_NAMESPACE", bucketmap.DefaultPatroniNamespace)}
	if e.zk == "" || e.dsn == "" || e.scope == "" {
		return nil, fmt.Errorf("run it through bench/failover/run (SHARDVISOR_ZK, SHARDVISOR_PG%s_DSN and SHARDVISOR_PG%s_PATRONI_SCOPE from scripts/devenv env)", n, n)
	}
	api := benchkit.EnvInt("SHARDVISOR_PG_PORT_BASE", 25432) + 1000 + *node - 1 // member m's REST API: +100*(m-1)
	e.apiPorts = []int{api, api + 100}
	return e, nil
}

// stripPassword drops the password from a DSN's user info.
func stripPassword(dsn string) (string, error) {
	scheme, rest, ok1 := strings.Cut(dsn, "://")
	userinfo, hosts, ok2 := strings.Cut(rest, "@")
	if !ok1 || !ok2 {
		return "", fmt.Errorf("unexpected DSN form")
	}
	user, _, _ := strings.Cut(userinfo, ":")
	return scheme + "://" + user + "@" + hosts, nil
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
