package supervisor

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
)

// Recycling knobs gunicorn users expect (issue 24): a worker that has
// served max_requests requests (its own count, REQUESTS=N on its notify
// socket), or whose process tree's resident memory exceeds max_memory
// (measured by the executor's sampler, sampler.go), is replaced as
// max_lifetime replaces one: its replacement starts within the surge, and
// it drains only once that one is ready (reconcilePool, w.retiring).

// evMemory is the sampler's measurement of a worker's memory: the resident
// set of its main process and every descendant, in bytes.
type evMemory struct {
	w   *worker
	rss int64
}

// onRequests records a worker's cumulative request count.
func (m *machine) onRequests(w *worker, n uint64, now time.Time) {
	w.requests = n
	cfg := w.gen.spec.cfg
	if cfg.MaxRequests <= 0 {
		return
	}
	if w.requestLimit == 0 {
		// Drawn once per worker, so that workers started together do not
		// all reach their limit together.
		w.requestLimit = uint64(cfg.MaxRequests)
		if j := cfg.MaxRequestsJitter; j > 0 {
			w.requestLimit += uint64(m.randN(j + 1))
		}
	}
	if w.state != wReady || w.retiring || n < w.requestLimit {
		return
	}
	w.retiring = true
	w.retireWhy = "max_requests"
	m.log.Info("worker reached max_requests; replacing it", zap.Int64("worker", w.id), zap.Int("pid", w.pid),
		zap.Uint64("requests", n), zap.Uint64("limit", w.requestLimit))
}

// onMemory records a worker's memory and retires it when over max_memory.
func (m *machine) onMemory(ev evMemory, now time.Time) {
	w := ev.w
	if !m.hasWorker(w) {
		return
	}
	w.rss = ev.rss
	limit := w.gen.spec.cfg.MaxMemory
	if limit <= 0 || w.state != wReady || w.retiring || topo.ByteSize(ev.rss) <= limit {
		return
	}
	w.retiring = true
	w.retireWhy = "max_memory"
	m.log.Warn("worker's process tree is over max_memory; replacing it", zap.Int64("worker", w.id), zap.Int("pid", w.pid),
		zap.String("rss", mib(ev.rss)), zap.Int64("rss_bytes", ev.rss), zap.Stringer("max_memory", limit))
}

func mib(n int64) string { return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)) }
