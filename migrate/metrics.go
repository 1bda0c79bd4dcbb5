package migrate

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the mover's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	// Stragglers counts members (kind router or supervisor) that had not
	// applied a move's fence map when the member wait ran out, by what the
	// move did (action proceed or abort, Options.OnStraggler).
	Stragglers *prometheus.CounterVec
	// MemberWait is how long each fence step waited for the members.
	MemberWait prometheus.Histogram
}

// NewMetrics creates the mover's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Stragglers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardvisor_move_stragglers_total",
			Help: "Members (routers, supervisors) that had not applied a move's fence map when the member wait ran out."}, []string{"kind", "action"}),
		MemberWait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardvisor_move_member_wait_seconds",
			Help: "Time a move's fence step waited for every member to apply the map that sets the bucket moving.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
	}
	reg.MustRegister(m.Stragglers, m.MemberWait)
	return m
}

func (m *Metrics) memberWait(d time.Duration) {
	if m != nil {
		m.MemberWait.Observe(d.Seconds())
	}
}

func (m *Metrics) straggler(kind, action string) {
	if m != nil {
		m.Stragglers.WithLabelValues(kind, action).Inc()
	}
}
