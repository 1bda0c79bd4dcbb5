package supervisor

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// A broken deploy that boots (issue 24 §2): a config whose workers say
// READY=1 and answer 500 to everything. Before, its workers accepted on
// the shared socket for readiness.timeout, attempt after attempt: 42.9% of
// new-connection requests failed over 30 s. Now each attempt is one
// canary, killed at its first probe, and after MaxSwapAttempts the config
// is refused.
func TestBrokenDeployCostsOneCanaryPerAttemptAndIsRefused(t *testing.T) {
	t.Parallel()
	brokenDeploy(t, 4, 200*time.Millisecond, 2*time.Second, 0)
}

// The same with the default restart backoff (1 s doubling), measured over
// 30 s of load as the finding was: the figure in docs/supervisor.md.
func TestFaultsBrokenDeployOver30s(t *testing.T) {
	testenv.Faults(t)
	brokenDeploy(t, 4, time.Second, 30*time.Second, 30*time.Second)
}

func brokenDeploy(t *testing.T, workers int, initial, max, window time.Duration) {
	edit := func(c *topo.PoolConfig) {
		c.Workers = workers
		c.Surge = &workers
		c.Restart = topo.Backoff{Initial: topo.Duration(initial), Max: topo.Duration(max)}
		c.Probe = &topo.WorkerProbe{Path: "/healthz", Interval: topo.Duration(time.Second), Timeout: topo.Duration(time.Second), Failures: 3}
	}
	e, h, c, _, addr := zkPool(t, map[string]string{"TW_TAG": "v1"}, edit)
	h.waitFor(20*time.Second, "generation 1", serving(1, workers))
	spawned := testCounter(t, h, "shardvisor_supervisor_worker_spawns_total", "")
	l := startLoad(addr, 4)
	start := time.Now()
	l.waitTag(t, "v1", 50)

	bad := *c
	bad.Env = map[string]string{"TW_TAG": "v2", "TW_MODE": "broken"}
	e.setConfig(t, &bad)
	h.waitFor(60*time.Second, "the broken config refused", func(m topo.PoolMember) bool {
		return strings.Contains(m.LastError, "refused after")
	})
	refusedAfter := time.Since(start)
	// Its last canary is gone: only generation 1 runs.
	h.waitFor(20*time.Second, "only generation 1", serving(1, workers))
	failedBefore, okBefore := l.failed.Load(), l.ok.Load()
	if window > 0 {
		time.Sleep(time.Until(start.Add(window)))
	} else {
		l.mu.Lock() // the load's goroutines count on
		v1 := l.tags["v1"]
		l.mu.Unlock()
		l.waitTag(t, "v1", v1+200)
	}
	close(l.stop)
	l.wg.Wait()
	failed, ok := l.failed.Load(), l.ok.Load()
	t.Logf("broken deploy: refused %s after the load began; %d of %d new-connection requests failed (%.2f%%) over %s; after the refusal %d of %d",
		refusedAfter.Round(time.Millisecond), failed, failed+ok, 100*float64(failed)/float64(failed+ok), time.Since(start).Round(time.Second),
		failed-failedBefore, (failed+ok)-(failedBefore+okBefore))
	if failed != failedBefore {
		t.Errorf("%d requests failed after the config was refused (no broken worker ran): %v", failed-failedBefore, l.errs)
	}
	// Each attempt cost one canary: the rest of a generation never started.
	if n := testCounter(t, h, "shardvisor_supervisor_worker_kills_total", `reason="probe_first"`); n != MaxSwapAttempts {
		t.Errorf("kills{probe_first} = %v, want one canary per attempt (%d)", n, MaxSwapAttempts)
	}
	if n := testCounter(t, h, "shardvisor_supervisor_worker_spawns_total", "") - spawned; n != MaxSwapAttempts {
		t.Errorf("%v workers started for the broken config, want %d canaries", n, MaxSwapAttempts)
	}
	if l.tags["v2"] != 0 {
		t.Errorf("%d requests answered 200 by the broken config", l.tags["v2"])
	}
	st := e.waitStatus(t, "status failed", func(s *topo.PoolStatus) bool { return s.Result == topo.SwapFailed })
	if !strings.Contains(st.Error, fmt.Sprintf("refused after %d swaps whose canary failed", MaxSwapAttempts)) {
		t.Errorf("pool status %+v", st)
	}
	if g := testCounter(t, h, "shardvisor_supervisor_config_refused", ""); g != 1 {
		t.Errorf("config_refused = %v", g)
	}
}
