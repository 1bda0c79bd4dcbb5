package migrate

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardvisor/shardvisor/fleet"
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
	// ReverseLagBytes is, per move in its rollback window, the target's
	// WAL its reverse stream's source has not confirmed yet, as the
	// orphan watcher last probed it from the servers.
	ReverseLagBytes *prometheus.GaugeVec
	// ReverseState is 1 for each move in its window and its reverse
	// stream's probed state (running, disabled, lost, unknown).
	ReverseState *prometheus.GaugeVec
	// ReverseLost counts the ways back the orphan watcher found lost in a
	// rollback window (the window then ends at once): alert on any
	// increase.
	ReverseLost prometheus.Counter

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
		ReverseLagBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardvisor_move_reverse_lag_bytes",
			Help: "Per move in its rollback window: the target's WAL that the reverse stream's source has not confirmed, as probed from the servers."}, []string{"move"}),
		ReverseState: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardvisor_move_reverse_state",
			Help: "1 per move in its rollback window and its reverse stream's state probed from the servers: running, disabled, lost, unknown."}, []string{"move", "state"}),
		ReverseLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardvisor_move_reverse_lost_total",
			Help: "Reverse streams found lost in a rollback window (a failover of the target, an invalidated slot): the move can no longer be rolled back."}),
		frozenAt: map[string]time.Time{},
	}
	m.FrozenOldest = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardvisor_move_frozen_bucket_oldest_seconds",
		Help: "Age of the oldest open write pause of a move the orphan watcher follows (0: none). Above the pause cap, a bucket refuses writes on every node."},
		m.oldestFrozen)
	reg.MustRegister(m.Stragglers, m.MemberWait, m.FrozenOldest, m.OrphanResumes, m.FlipUnknown, m.ThawsWithoutZooKeeper,
		m.ReverseLagBytes, m.ReverseState, m.ReverseLost)
	// Every counter's series exist at 0 from the start, so that an alert
	// on increase() sees the first event (deploy/prometheus).
	for _, kind := range []string{fleet.KindRouter, fleet.KindSupervisor} {
		for _, action := range []string{StragglerProceed, StragglerAbort} {
			m.Stragglers.WithLabelValues(kind, action)
		}
	}
	for _, result := range orphanResults {
		m.OrphanResumes.WithLabelValues(result)
	}
	return m
}

// orphanResults are OrphanResumes's results.
var orphanResults = []string{"finished", "busy", "window", "error"}

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

// reverseStates are ReverseState's states.
var reverseStates = []string{ReverseRunning, ReverseDisabled, ReverseLost, ReverseUnknown}

// reverseProbed records a probe of move id's reverse stream.
func (m *Metrics) reverseProbed(id string, p *ReverseProbe) {
	if m == nil || p == nil {
		return
	}
	for _, s := range reverseStates {
		v := 0.0
		if s == p.State {
			v = 1
		}
		m.ReverseState.WithLabelValues(id, s).Set(v)
	}
	if p.LagBytes != nil {
		m.ReverseLagBytes.WithLabelValues(id).Set(float64(*p.LagBytes))
	} else if p.State == ReverseLost {
		m.ReverseLagBytes.DeleteLabelValues(id)
	}
}

// reverseGone forgets move id's reverse stream (its window ended).
func (m *Metrics) reverseGone(id string) {
	if m == nil {
		return
	}
	for _, s := range reverseStates {
		m.ReverseState.DeleteLabelValues(id, s)
	}
	m.ReverseLagBytes.DeleteLabelValues(id)
}

func (m *Metrics) reverseLost() {
	if m != nil {
		m.ReverseLost.Inc()
	}
}
