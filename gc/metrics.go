package gc

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are GC's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	Deleted   *prometheus.CounterVec
	Batches   *prometheus.CounterVec
	BatchTime prometheus.Histogram
	Remaining prometheus.Gauge
	Skipped   *prometheus.CounterVec
}

// NewMetrics creates GC's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Deleted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardvisor_gc_rows_deleted_total",
			Help: "Rows GC deleted from nodes that no longer own them."}, []string{"node", "table"}),
		Batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardvisor_gc_batches_total",
			Help: "Delete transactions GC ran."}, []string{"node", "table"}),
		BatchTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardvisor_gc_batch_seconds",
			Help: "Duration of one GC delete transaction.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		Remaining: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardvisor_gc_rows_remaining",
			Help: "Rows the current GC run still means to delete."}),
		Skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardvisor_gc_ranges_skipped_total",
			Help: "Ranges GC left alone, by reason."}, []string{"kind"}),
	}
	reg.MustRegister(m.Deleted, m.Batches, m.BatchTime, m.Remaining, m.Skipped)
	return m
}

func (m *Metrics) batch(node, table string, n int64, d time.Duration, remaining int64) {
	if m == nil {
		return
	}
	m.Deleted.WithLabelValues(node, table).Add(float64(n))
	m.Batches.WithLabelValues(node, table).Inc()
	m.BatchTime.Observe(d.Seconds())
	m.Remaining.Set(float64(remaining))
}

func (m *Metrics) remaining(n int64) {
	if m != nil {
		m.Remaining.Set(float64(n))
	}
}

func (m *Metrics) skipped(kind string) {
	if m != nil {
		m.Skipped.WithLabelValues(kind).Inc()
	}
}
