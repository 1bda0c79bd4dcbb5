package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/router"
)

// routeMetrics count the routing answers and the refused requests.
type routeMetrics struct {
	lookups     prometheus.Counter
	batchUIDs   prometheus.Counter
	stale       prometheus.Counter
	suspended   prometheus.Counter
	moved       prometheus.Counter
	badRequests *prometheus.CounterVec
}

// registerMetrics creates the handler's metrics and registers them, with
// the router's, in reg (served at /metrics; docs/router-api.md lists them).
func (h *handler) registerMetrics(reg *prometheus.Registry) {
	const ns = "shardvisor_router_"
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: ns + name, Help: help})
	}
	h.lookups = counter("lookups_total", "User ids routed over HTTP (single and batch).")
	h.batchUIDs = counter("batch_lookups_total", "User ids routed through POST /v1/route.")
	h.stale = counter("stale_answers_total", "Answers given while the ZooKeeper session was lost (marked stale).")
	h.suspended = counter("suspended_answers_total", "Answers given while the ZooKeeper session was suspended.")
	h.moved = counter("moved_answers_total", "Answers that told a caller its map was stale and the bucket moved.")
	h.badRequests = prometheus.NewCounterVec(
		prometheus.CounterOpts{Name: ns + "bad_requests_total", Help: "Requests refused with 400, by reason."},
		[]string{"reason"})
	r := h.r
	reg.MustRegister(h.lookups, h.batchUIDs, h.stale, h.suspended, h.moved, h.badRequests,
		prometheus.NewGaugeFunc(
			prometheus.GaugeOpts{Name: ns + "map_version", Help: "Version of the bucket map in use (0: none yet)."},
			func() float64 {
				if m := r.Map(); m != nil {
					return float64(m.Version)
				}
				return 0
			}),
		prometheus.NewCounterFunc(
			prometheus.CounterOpts{Name: ns + "map_updates_total", Help: "Bucket map versions applied."},
			func() float64 { return float64(r.Stats().MapUpdates.Load()) }),
		prometheus.NewCounterFunc(
			prometheus.CounterOpts{Name: ns + "map_rejected_total",
				Help: "Bucket maps refused (missing, malformed, older); the last good map stays in use."},
			func() float64 { return float64(r.Stats().MapRejected.Load()) }),
		prometheus.NewGaugeFunc(
			prometheus.GaugeOpts{Name: ns + "zk_state", Help: "ZooKeeper session state: 0 lost, 1 suspended, 2 connected, 3 closed."},
			func() float64 { return float64(r.ZKState()) }),
	)
	if h.groupCache != nil {
		reg.MustRegister(newGroupCollector(h))
	}
	reg.MustRegister(newGCCollector(h))
	label := []string{"node", "pooler"}
	reg.MustRegister(&poolCollector{h: h,
		up:          prometheus.NewDesc(ns+"pooler_up", "1 when a db node's pooler (PgBouncer, its pool_dsn) answered on its admin console at the last read, 0 when it did not.", label, nil),
		clients:     prometheus.NewDesc(ns+"pooler_clients", "Client connections a db node's pooler holds (active and waiting).", label, nil),
		waiting:     prometheus.NewDesc(ns+"pooler_waiting_clients", "Clients of a db node's pooler waiting for a server connection: above 0 for long, the pool is too small for the load.", label, nil),
		maxWait:     prometheus.NewDesc(ns+"pooler_max_wait_seconds", "How long the longest-waiting client of a db node's pooler has waited.", label, nil),
		servers:     prometheus.NewDesc(ns+"pooler_server_connections", "Server connections a db node's pooler holds to PostgreSQL, in any state.", label, nil),
		serverLimit: prometheus.NewDesc(ns+"pooler_server_limit", "The most server connections a db node's pooler opens to one database (max_db_connections, else default_pool_size).", label, nil),
		clientLimit: prometheus.NewDesc(ns+"pooler_client_limit", "max_client_conn of a db node's pooler: clients past it are refused.", label, nil)})
	if h.fleetStatus != nil {
		reg.MustRegister(newFleetCollector(h))
	}
}

// count counts an answer by what it says.
func (h *handler) count(rt router.Route) {
	switch {
	case rt.Stale:
		h.stale.Inc()
	case rt.Suspended:
		h.suspended.Inc()
	}
	if rt.Moved {
		h.moved.Inc()
	}
}

// groupCollector exports each Patroni group's health from the group cache
// (read at most once per groupsMaxAge for every scrape and page together).
type groupCollector struct {
	h                                                  *handler
	whole, problems                                    *prometheus.Desc
	members, expected, running, leader, sync, syncMode *prometheus.Desc
}

func newGroupCollector(h *handler) *groupCollector {
	const ns = "shardvisor_router_patroni_group_"
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(ns+name, help, append([]string{"node"}, labels...), nil)
	}
	return &groupCollector{h: h,
		whole: d("whole", "1 when a db node's Patroni group has a leader, synchronous_mode on and a synchronous standby now; "+
			"0 when a failover now may lose acknowledged writes (alert on it)."),
		problems: d("problems", "Problems with a db node's Patroni group by severity (severe: acknowledged writes or moves at risk now; "+
			"open records are severe), -1 when its records cannot be read.", "severity"),
		members: d("members", "Members of a db node's Patroni group registered in ZooKeeper (a member's record lives "+
			"while its Patroni holds its session); absent when the records cannot be read."),
		expected: d("members_expected", "Members a db node's Patroni group should have: the hosts its DSN lists "+
			"(a group's DSN lists every member, docs/failover.md)."),
		running: d("members_running", "Members of a db node's Patroni group whose PostgreSQL runs (state running or streaming)."),
		leader:  d("leader", "1 when a member of a db node's Patroni group holds the leader key and has a member record, 0 when none does."),
		sync:    d("sync_standbys", "Registered members of a db node's Patroni group that its sync record names synchronous standbys now."),
		syncMode: d("synchronous_mode", "1 when a db node's Patroni group's dynamic configuration has synchronous_mode on, "+
			"0 when it is off or there is no configuration."),
	}
}

func (c *groupCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.whole, c.problems, c.members, c.expected, c.running, c.leader, c.sync, c.syncMode} {
		ch <- d
	}
}

// groupGauges are one group's gauges.
type groupGauges struct {
	whole, severe, warnings                  float64
	members, running, leader, sync, syncMode float64
	readable                                 bool
}

// groupGaugesOf works out a group's gauges from its view.
func groupGaugesOf(v *GroupView) groupGauges {
	if v.Error != "" {
		return groupGauges{severe: -1}
	}
	g := groupGauges{readable: true}
	if v.Unsafe() == "" {
		g.whole = 1
	}
	for _, p := range v.Problems {
		if p.Severe {
			g.severe++
		} else {
			g.warnings++
		}
	}
	if _, ok := v.Primary(); ok {
		g.leader = 1
	}
	if v.Config != nil && v.Config.SynchronousMode {
		g.syncMode = 1
	}
	for _, m := range v.Members {
		g.members++
		if m.Error == "" && (m.State == "running" || m.State == "streaming") {
			g.running++
		}
		if m.Sync && !m.Leader && m.Error == "" {
			g.sync++
		}
	}
	return g
}

func (c *groupCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.h.r.Map()
	for id, v := range c.h.groupCache.get(m) {
		node := string(id)
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{node}, labels...)...)
		}
		if n, ok := m.Node(id); ok {
			gauge(c.expected, float64(len(bucketmap.DSNHosts(n.DSN))))
		}
		g := groupGaugesOf(v)
		gauge(c.whole, g.whole)
		gauge(c.problems, g.severe, "severe")
		if !g.readable {
			continue
		}
		gauge(c.problems, g.warnings, "warning")
		gauge(c.members, g.members)
		gauge(c.running, g.running)
		gauge(c.leader, g.leader)
		gauge(c.sync, g.sync)
		gauge(c.syncMode, g.syncMode)
	}
}

// poolCollector exports each pooled node's poolers from the pool cache
// (read at most once per poolsMaxAge for every scrape and page together).
type poolCollector struct {
	h                                                                *handler
	up, clients, waiting, maxWait, servers, serverLimit, clientLimit *prometheus.Desc
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.clients, c.waiting, c.maxWait, c.servers, c.serverLimit, c.clientLimit} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, node, addr string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, node, addr)
	}
	m := c.h.r.Map()
	for id, v := range c.h.poolCache.get(m) {
		node := string(id)
		if len(v.Poolers) == 0 && len(v.Errors) == 0 {
			// Not even tried (its password reference does not resolve
			// here, say): down at every address its pool DSN names, so
			// that an alert on pooler_up fires.
			if n, ok := m.Node(id); ok {
				for _, addr := range bucketmap.DSNHosts(n.PoolDSN) {
					gauge(c.up, 0, node, addr)
				}
			}
			continue
		}
		for _, p := range v.Poolers {
			gauge(c.up, 1, node, p.Addr)
			gauge(c.clients, float64(p.Clients), node, p.Addr)
			gauge(c.waiting, float64(p.Waiting), node, p.Addr)
			gauge(c.maxWait, p.MaxWait.Seconds(), node, p.Addr)
			gauge(c.servers, float64(p.Servers), node, p.Addr)
			gauge(c.serverLimit, float64(p.ServerLimit), node, p.Addr)
			gauge(c.clientLimit, float64(p.ClientLimit), node, p.Addr)
		}
		for addr := range v.Errors {
			gauge(c.up, 0, node, addr)
		}
	}
}
