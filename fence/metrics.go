package fence

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardvisor/shardvisor/bucketmap"
)

// WatchMetrics are the continuous fence reconciler's (Watch, `shardctl
// node reconcile --watch --metrics-addr`) Prometheus metrics. A nil
// *WatchMetrics records nothing.
type WatchMetrics struct {
	// NodeSync is 1 for each node the reconciler syncs and the outcome of
	// its last sync (one of syncStatuses): a node "unreachable", "failed",
	// "ahead" or "not-installed" for long has a fence out of step with the
	// map (a node down that comes back accepts writes to the buckets it
	// lost until it is synced).
	NodeSync *prometheus.GaugeVec
	// Syncs counts every sync's outcome, by status (every status exported
	// at 0 from the start).
	Syncs *prometheus.CounterVec
	// MapVersion is the map version the reconciler follows (0 until it
	// has read one).
	MapVersion prometheus.Gauge
}

// syncStatuses are NodeSync.Status's values.
var syncStatuses = []string{SyncInStep, SyncRepaired, SyncNotInstalled, SyncStale, SyncAhead, SyncUnreachable, SyncFailed}

// NewWatchMetrics creates the reconciler's metrics and registers them
// with reg.
func NewWatchMetrics(reg prometheus.Registerer) *WatchMetrics {
	m := &WatchMetrics{
		NodeSync: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardvisor_fence_node_sync",
			Help: "1 for each db node the fence reconciler syncs and the outcome of its last sync: in-step, repaired, not-installed, stale, ahead, unreachable, failed."},
			[]string{"node", "status"}),
		Syncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardvisor_fence_syncs_total",
			Help: "Syncs of a db node's fence to the map by the fence reconciler, by outcome."}, []string{"status"}),
		MapVersion: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardvisor_fence_reconciler_map_version",
			Help: "The bucket map version the fence reconciler follows (0: none read yet)."}),
	}
	reg.MustRegister(m.NodeSync, m.Syncs, m.MapVersion)
	for _, s := range syncStatuses {
		m.Syncs.WithLabelValues(s)
	}
	return m
}

// synced records one sync's outcome.
func (m *WatchMetrics) synced(r NodeSync) {
	if m == nil {
		return
	}
	m.Syncs.WithLabelValues(r.Status).Inc()
	for _, s := range syncStatuses {
		v := 0.0
		if s == r.Status {
			v = 1
		}
		m.NodeSync.WithLabelValues(string(r.Node), s).Set(v)
	}
}

// following records the map the reconciler follows, and forgets the
// nodes it no longer syncs.
func (m *WatchMetrics) following(version uint64, synced func(bucketmap.NodeID) bool, known []bucketmap.NodeID) {
	if m == nil {
		return
	}
	m.MapVersion.Set(float64(version))
	for _, id := range known {
		if !synced(id) {
			for _, s := range syncStatuses {
				m.NodeSync.DeleteLabelValues(string(id), s)
			}
		}
	}
}
