package supervisor

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/shardvisor/shardvisor/internal/version"
)

// metrics are per Supervisor (its own registry), so tests can run several.
type metrics struct {
	reg           *prometheus.Registry
	generation    prometheus.Gauge
	configVersion prometheus.Gauge
	mapVersion    prometheus.Gauge
	target        prometheus.Gauge
	workers       *prometheus.GaugeVec
	accepting     prometheus.Gauge
	zkState       *prometheus.GaugeVec
	swaps         *prometheus.CounterVec
	swapDuration  prometheus.Histogram
	readiness     prometheus.Histogram
	spawns        prometheus.Counter
	restarts      prometheus.Counter
	exits         *prometheus.CounterVec
	stops         *prometheus.CounterVec
	kills         *prometheus.CounterVec
	configErrors  prometheus.Counter
	mapErrors     prometheus.Counter
	// notifyRejected counts sd_notify datagrams refused for not coming
	// from the worker's process tree (notify.go).
	notifyRejected prometheus.Counter
	// Reload-mode map delivery.
	mapDeliveries  prometheus.Counter
	mapAcks        prometheus.Counter
	mapAckTimeouts prometheus.Counter
	mapAckSeconds  prometheus.Histogram
	// workerMapVersion is the lowest map version the ready workers route
	// by (what the member record publishes).
	workerMapVersion prometheus.Gauge
	// Fail-static (failstatic.go).
	failStatic         prometheus.Gauge
	failStaticEpisodes prometheus.Counter
	peerChecks         *prometheus.CounterVec
	// Stability (issue 15): swaps rolled back, and workers whose HTTP
	// probe failed.
	rollbacks     *prometheus.CounterVec
	probeFailures prometheus.Counter
	// A broken deploy that boots (canary.go): workers killed at their
	// first probe after READY=1, and 1 while the newest config is refused.
	probeFirstFailures prometheus.Counter
	configRefused      prometheus.Gauge
	// zkSessionTimeout is the session timeout the ensemble granted.
	zkSessionTimeout prometheus.Gauge
}

// The label values every vector is initialised with, so that a counter
// reads 0 in /metrics before its first event (an alert on rate() or
// increase() needs the series to exist).
var (
	exitKinds   = []string{"expected", "crash", "boot_failure"}
	stopReasons = []string{"superseded", "swap_failed", "replaced", "scale_down", "readiness_timeout", "shutdown",
		"max_lifetime", "max_requests", "max_memory", "map_ack_timeout", "rolled_back"}
	killReasons   = []string{"graceful_timeout", "readiness_timeout", "watchdog", "probe", "probe_first", "stopped", "zk_lost", "fast_stop"}
	swapResults   = []string{"ok", "failed", "superseded", "invalid_config", "invalid_map", "rolled_back"}
	rollbackKinds = []string{"window", "crash_loop"}
)

func newMetrics(reg *prometheus.Registry) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.Collector())
	}
	const ns, sub = "shardvisor", "supervisor"
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels)
	}
	buckets := []float64{.05, .1, .25, .5, 1, 2, 3, 5, 10, 20, 30, 60, 120}
	m := &metrics{
		reg:           reg,
		generation:    g("generation", "Generation currently serving (the newest that completed a swap)."),
		configVersion: g("config_version", "Pool config version applied by the serving generation."),
		mapVersion:    g("map_version", "Bucket map version applied by the serving generation (0: none)."),
		target:        g("target_workers", "Workers wanted: the config's workers plus TTIN minus TTOU."),
		workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "workers",
			Help: "Worker processes by state (starting, ready, stopping)."}, []string{"state"}),
		accepting: g("accepting", "1 while the listen sockets are open, 0 while closed (ZooKeeper session lost, stopping)."),
		zkState: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "zk_state",
			Help: "1 for the current ZooKeeper session state (connected, suspended, lost, closed, none for --config mode)."}, []string{"state"}),
		swaps:        cv("swaps_total", "Generation swaps by result: ok, failed, superseded, invalid_config, invalid_map, rolled_back.", "result"),
		swapDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "swap_duration_seconds", Help: "Time from a generation's creation to its last worker being ready and the old ones signalled.", Buckets: buckets}),
		readiness:    prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "readiness_seconds", Help: "Time from spawning a worker to it being ready.", Buckets: buckets}),
		spawns:       c("worker_spawns_total", "Worker processes started."),
		restarts:     c("worker_restarts_total", "Workers respawned after a crash (with backoff)."),
		exits:        cv("worker_exits_total", "Worker exits by kind: expected (after a stop), crash, boot_failure.", "kind"),
		stops:        cv("worker_stops_total", "Workers sent SIGTERM, by reason.", "reason"),
		kills:        cv("worker_kills_total", "Workers sent SIGKILL (or the watchdog's SIGQUIT), by reason.", "reason"),
		configErrors: c("config_errors_total", "Pool configs rejected by validation."),
		mapErrors:    c("map_errors_total", "Bucket maps rejected by validation."),
		notifyRejected: c("notify_rejected_total",
			"sd_notify datagrams refused because the sender is not a process of the worker's tree (another uid, or outside it)."),
		mapDeliveries:  c("map_deliveries_total", "Reload mode: new maps written to the live map file and announced to the workers."),
		mapAcks:        c("map_acks_total", "Reload mode: MAPVERSION acknowledgements that brought a worker up to the live map."),
		mapAckTimeouts: c("map_ack_timeouts_total", "Reload mode: workers replaced because they did not acknowledge a new map within map_delivery.ack_timeout."),
		mapAckSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "map_ack_seconds",
			Help: "Reload mode: time from announcing a new map to a worker acknowledging it.", Buckets: []float64{.01, .025, .05, .1, .2, .5, 1, 2, 5, 10}}),
		workerMapVersion:   g("worker_map_version", "Lowest bucket map version the ready workers route by (the member record's map_version)."),
		failStatic:         g("fail_static", "1 while serving on through a whole-ZooKeeper-ensemble outage (the peers agree), with the last config and map; 0 otherwise."),
		failStaticEpisodes: c("fail_static_episodes_total", "Times this supervisor went fail-static."),
		peerChecks:         cv("peer_checks_total", "Peer checks after a session loss by verdict: outage (fail-static), cut_off (leave service), shared (the connected peers reconnected after this host's last answer: wait for its own session).", "verdict"),
		rollbacks: cv("rollbacks_total", "New configs rolled back because their workers crashed after READY=1, by kind: window "+
			"(inside the stability window; the previous generation never stopped) or crash_loop (soon after; the previous config was restarted).", "kind"),
		probeFailures:      c("probe_failures_total", "HTTP probes of workers that failed (a timeout, a refused connection, or a status that is not 2xx)."),
		probeFirstFailures: c("probe_first_failures_total", "Workers killed because their first HTTP probe after READY=1 failed (they accept on the shared sockets from then on)."),
		configRefused: g("config_refused", "1 while the newest pool config is refused until it changes (rolled back, or "+
			"MaxSwapAttempts swaps whose canary failed its first probe); 0 otherwise."),
		zkSessionTimeout: g("zk_session_timeout_seconds", "The ZooKeeper session timeout the ensemble granted (0: not connected yet, or no ZooKeeper)."),
	}
	reg.MustRegister(m.generation, m.configVersion, m.mapVersion, m.target, m.workers, m.accepting, m.zkState, m.swaps,
		m.swapDuration, m.readiness, m.spawns, m.restarts, m.exits, m.stops, m.kills, m.configErrors, m.mapErrors, m.notifyRejected,
		m.mapDeliveries, m.mapAcks, m.mapAckTimeouts, m.mapAckSeconds, m.workerMapVersion,
		m.failStatic, m.failStaticEpisodes, m.peerChecks, m.rollbacks, m.probeFailures, m.zkSessionTimeout,
		m.probeFirstFailures, m.configRefused)
	for _, v := range exitKinds {
		m.exits.WithLabelValues(v)
	}
	for _, v := range stopReasons {
		m.stops.WithLabelValues(v)
	}
	for _, v := range killReasons {
		m.kills.WithLabelValues(v)
	}
	for _, v := range swapResults {
		m.swaps.WithLabelValues(v)
	}
	for _, v := range rollbackKinds {
		m.rollbacks.WithLabelValues(v)
	}
	for _, v := range []string{"outage", "cut_off", "shared"} {
		m.peerChecks.WithLabelValues(v)
	}
	for _, st := range []string{"starting", "ready", "stopping"} {
		m.workers.WithLabelValues(st)
	}
	return m
}

func (m *metrics) setZK(state string) {
	for _, s := range []string{"connected", "suspended", "lost", "closed", "none"} {
		v := 0.0
		if s == state {
			v = 1
		}
		m.zkState.WithLabelValues(s).Set(v)
	}
}
