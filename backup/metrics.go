package backup

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardvisor/shardvisor/topo"
)

// Metrics are the backup watcher's (`shardctl restore-point watch`). A nil
// *Metrics records nothing.
type Metrics struct {
	Age       *prometheus.GaugeVec
	Failing   *prometheus.GaugeVec
	Problems  *prometheus.GaugeVec
	PointTime prometheus.Gauge
	PointFail prometheus.Counter
	PointCut  prometheus.Histogram
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Age: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardvisor_backup_newest_age_seconds",
			Help: "Age of the db node's newest good backup (pgBackRest); absent until the node has one."}, []string{"node"}),
		Failing: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardvisor_backup_archive_failing",
			Help: "1 when the node's primary failed to archive its last WAL segment (pg_stat_archiver: the last failure after the last success) or has archive_mode off."}, []string{"node"}),
		Problems: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardvisor_backup_problems",
			Help: "Backup problems of the db node at the last check (shardctl backup list says which)."}, []string{"node"}),
		PointTime: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardvisor_restore_point_last_timestamp_seconds",
			Help: "When the watcher last cut a restore point (Unix time)."}),
		PointFail: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardvisor_restore_point_failures_total",
			Help: "Restore points the watcher failed to cut."}),
		PointCut: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardvisor_restore_point_cut_seconds",
			Help: "How long a restore point's cut took, first node's point to last.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 12)}),
	}
	reg.MustRegister(m.Age, m.Failing, m.Problems, m.PointTime, m.PointFail, m.PointCut)
	return m
}

// Point records a restore point cut (rp nil: it failed).
func (m *Metrics) Point(rp *topo.RestorePoint) {
	if m == nil {
		return
	}
	if rp == nil {
		m.PointFail.Inc()
		return
	}
	m.PointTime.Set(float64(rp.At.Unix()))
	m.PointCut.Observe(rp.CutMS / 1000)
}

// Status records the nodes' backup status.
func (m *Metrics) Status(st []NodeStatus) {
	if m == nil {
		return
	}
	m.Age.Reset()
	m.Failing.Reset()
	m.Problems.Reset()
	for _, ns := range st {
		if ns.Newest != nil {
			m.Age.WithLabelValues(ns.Node).Set(ns.AgeSeconds)
		}
		failing := 0.0
		if a := ns.Archiver; a != nil && (a.Failing() || a.Mode == "off") {
			failing = 1
		}
		m.Failing.WithLabelValues(ns.Node).Set(failing)
		m.Problems.WithLabelValues(ns.Node).Set(float64(len(ns.Problems)))
	}
}
