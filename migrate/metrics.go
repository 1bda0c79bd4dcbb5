package migrate

import (
	"sync"
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
	// FrozenOldest is the age, in seconds, of the oldest write pause the
	// orphan watcher (Mover.WatchOrphans) knows to be open: a bucket whose
	// writes every node refuses. 0 when there is none. Above the pause cap
	// a mover died inside the pause and nobody has resumed the move yet.
	FrozenOldest prometheus.GaugeFunc
	// OrphanResumes counts the orphan watcher's resumes by result:
	// finished (rolled back or completed), busy (another mover took it
	// first), window (left in its rollback window, until it ends), error
	// (tried again with backoff).
	OrphanResumes *prometheus.CounterVec
	// FlipUnknown is the number of moves whose flip was sent to ZooKeeper
	// without an answer: their bucket stays frozen until ZooKeeper says
	// whether the map gives it to the target. Page on it.
	FlipUnknown prometheus.Gauge
	// ThawsWithoutZooKeeper counts write pauses a mover ended on the
	// source by itself, before its abort reached ZooKeeper.
	ThawsWithoutZooKeeper prometheus.Counter

	mu       sync.Mutex
	frozenAt map[string]time.Time
}

// NewMetrics creates the mover's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Stragglers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardvisor_move_stragglers_total",
			Help: "Members (routers, supervisors) that had not applied a move's fence map when the member wait ran out."}, []string{"kind", "action"}),
		MemberWait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardvisor_move_member_wait_seconds",
			Help: "Time a move's fence step waited for every member to apply the map that sets the bucket moving.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
		OrphanResumes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardvisor_move_orphan_resumes_total",
			Help: "Resumes of orphaned moves (their mover died) by the orphan watcher, by result: finished, busy, window, error."}, []string{"result"}),
		FlipUnknown: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardvisor_move_flip_outcome_unknown",
			Help: "Moves whose flip was sent to ZooKeeper without an answer: their bucket refuses writes until ZooKeeper answers."}),
		ThawsWithoutZooKeeper: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardvisor_move_thaws_total",
			Help: "Write pauses ended on the source by the mover itself, before its rollback reached ZooKeeper."}),
		frozenAt: map[string]time.Time{},
	}
	m.FrozenOldest = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardvisor_move_frozen_bucket_oldest_seconds",
		Help: "Age of the oldest open write pause of a move the orphan watcher follows (0: none). Above the pause cap, a bucket refuses writes on every node."},
		m.oldestFrozen)
	reg.MustRegister(m.Stragglers, m.MemberWait, m.FrozenOldest, m.OrphanResumes, m.FlipUnknown, m.ThawsWithoutZooKeeper)
	return m
}

// OldestFrozen is the age of the oldest open write pause known (0: none).
func (m *Metrics) OldestFrozen() time.Duration {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var oldest time.Duration
	for _, t := range m.frozenAt {
		oldest = max(oldest, time.Since(t))
	}
	return oldest
}

func (m *Metrics) oldestFrozen() float64 { return m.OldestFrozen().Seconds() }

func (m *Metrics) frozen(id string, since time.Time) {
	if m != nil {
		m.mu.Lock()
		m.frozenAt[id] = since
		m.mu.Unlock()
	}
}

func (m *Metrics) unfrozen(id string) {
	if m != nil {
		m.mu.Lock()
		delete(m.frozenAt, id)
		m.mu.Unlock()
	}
}

func (m *Metrics) orphanResumed(result string) {
	if m != nil {
		m.OrphanResumes.WithLabelValues(result).Inc()
	}
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

func (m *Metrics) flipUnknown(d float64) {
	if m != nil {
		m.FlipUnknown.Add(d)
	}
}

func (m *Metrics) thawed() {
	if m != nil {
		m.ThawsWithoutZooKeeper.Inc()
	}
}
