package supervisor

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// max_requests and max_memory with real workers under load (issue 24,
// part 3): the worker is replaced through the zero-drop path.

func TestMaxRequestsRecyclesUnderLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	port := testenv.FreePort(t)
	file := filepath.Join(dir, "pool.json")
	c := cfgFor(t, port, 2, map[string]string{"TW_REPORT_REQUESTS": "1"})
	one := 1
	c.Surge = &one
	c.MaxRequests, c.MaxRequestsJitter = 100, 20
	writeConfig(t, file, c)
	h := run(t, Options{ConfigFile: file})
	h.waitFor(20*time.Second, "2 workers", serving(1, 2))
	l := startLoad(fmt.Sprintf("127.0.0.1:%d", port), 3)
	testenv.WaitFor(t, 30*time.Second, func() bool {
		return testCounter(t, h, "shardvisor_supervisor_worker_stops_total", `reason="max_requests"`) >= 3
	}, "3 workers recycled at max_requests")
	l.finish(t)
	if !strings.Contains(logText(t, h), "worker reached max_requests; replacing it") {
		t.Error("the log does not say why workers were replaced")
	}
	if n := testCounter(t, h, "shardvisor_supervisor_worker_exits_total", `kind="crash"`); n != 0 {
		t.Errorf("%v crashes", n)
	}
}

func TestMaxMemoryRecyclesUnderLoad(t *testing.T) {
	every := memEvery
	memEvery = 100 * time.Millisecond
	t.Cleanup(func() { memEvery = every })
	dir := t.TempDir()
	port := testenv.FreePort(t)
	file := filepath.Join(dir, "pool.json")
	// Worker 1 grows by 128 MiB once ready; its replacements do not.
	c := cfgFor(t, port, 2, map[string]string{"TW_GROW": "128", "TW_GROW_WORKER": "1"})
	c.MaxMemory = 96 << 20
	writeConfig(t, file, c)
	h := run(t, Options{ConfigFile: file})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	testenv.WaitFor(t, 20*time.Second, func() bool { _, err := get(addr); return err == nil }, "the first answer")
	l := startLoad(addr, 3)
	h.waitFor(20*time.Second, "worker 1 replaced, 2 ready", func(m topo.PoolMember) bool {
		ready := 0
		for _, w := range m.Workers {
			if w.ID == 1 {
				return false
			}
			if w.State == "ready" {
				ready++
			}
		}
		return ready == 2
	})
	l.finish(t)
	if n := testCounter(t, h, "shardvisor_supervisor_worker_stops_total", `reason="max_memory"`); n != 1 {
		t.Errorf("stops{max_memory} = %v, want 1 (only worker 1 grows)", n)
	}
	log := logText(t, h)
	i := strings.Index(log, "worker's process tree is over max_memory; replacing it")
	if i < 0 {
		t.Fatal("the log does not say a worker was over max_memory")
	}
	line, _, _ := strings.Cut(log[i:], "\n")
	t.Logf("%s", line)
	if !strings.Contains(line, `"max_memory": "96MiB"`) || !strings.Contains(line, `"rss_bytes"`) {
		t.Errorf("the log line lacks the figures: %s", line)
	}
}
