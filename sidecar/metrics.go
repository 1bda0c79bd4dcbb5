package sidecar

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
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
		reg.MustRegister(&groupCollector{h: h,
			whole: prometheus.NewDesc(ns+"patroni_group_whole",
				"1 when a db node's Patroni group has a leader, synchronous_mode on and a synchronous standby now; 0 when a failover now may lose acknowledged writes (alert on it).",
				[]string{"node"}, nil),
			problems: prometheus.NewDesc(ns+"patroni_group_problems",
				"Problems with a db node's Patroni group by severity (severe: acknowledged writes or moves at risk now; open records are severe), -1 when its records cannot be read.",
				[]string{"node", "severity"}, nil)})
	}
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
		reg.MustRegister(&schemaCollector{h: h,
			changes: prometheus.NewDesc(ns+"schema_changes",
				"Recorded schema changes by state (applied, partial, failed, pending), from the fleet view.",
				[]string{"state"}, nil),
			drift: prometheus.NewDesc(ns+"schema_drift_differences",
				"Differences the last `shardctl schema diff` found (sharded tables, and changes a node lacks); -1 before any.",
				nil, nil),
			backupProblems: prometheus.NewDesc(ns+"backup_node_problems",
				"Backup problems of a db node at the backup watcher's last check (no stanza, archiving off or failing, no backup, newest too old), from the fleet view.",
				[]string{"node"}, nil),
			backupChecked: prometheus.NewDesc(ns+"backup_checked_timestamp_seconds",
				"When the backup watcher (shardctl restore-point watch) last checked every node's backups (Unix time); absent before any check.",
				nil, nil)})
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
	h               *handler
	whole, problems *prometheus.Desc
}

func (c *groupCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.whole; ch <- c.problems }

func (c *groupCollector) Collect(ch chan<- prometheus.Metric) {
	for id, v := range c.h.groupCache.get(c.h.r.Map()) {
		node := string(id)
		if v.Error != "" {
			ch <- prometheus.MustNewConstMetric(c.problems, prometheus.GaugeValue, -1, node, "severe")
			ch <- prometheus.MustNewConstMetric(c.whole, prometheus.GaugeValue, 0, node)
			continue
		}
		whole, severe, warnings := 0.0, 0, 0
		if v.Unsafe() == "" {
			whole = 1
		}
		for _, p := range v.Problems {
			if p.Severe {
				severe++
			} else {
				warnings++
			}
		}
		ch <- prometheus.MustNewConstMetric(c.whole, prometheus.GaugeValue, whole, node)
		ch <- prometheus.MustNewConstMetric(c.problems, prometheus.GaugeValue, float64(severe), node, "severe")
		ch <- prometheus.MustNewConstMetric(c.problems, prometheus.GaugeValue, float64(warnings), node, "warning")
	}
}

// schemaCollector exports the schema history's states, the last drift
// check and the backup watcher's last check from the fleet view (cached by fleet.Status: a scrape does not
// read ZooKeeper more often than the view's refresh allows).
type schemaCollector struct {
	h                                             *handler
	changes, drift, backupProblems, backupChecked *prometheus.Desc
}

func (c *schemaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.changes
	ch <- c.drift
	ch <- c.backupProblems
	ch <- c.backupChecked
}

func (c *schemaCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v := c.h.fleetView(ctx)
	if !v.Available {
		return
	}
	for _, st := range []string{topo.SchemaApplied, topo.SchemaPartial, topo.SchemaFailed, topo.SchemaPending} {
		ch <- prometheus.MustNewConstMetric(c.changes, prometheus.GaugeValue, float64(v.Schema.ByState[st]), st)
	}
	d := -1.0
	if v.Schema.Drift != nil {
		d = float64(v.Schema.Drift.Count)
	}
	ch <- prometheus.MustNewConstMetric(c.drift, prometheus.GaugeValue, d)
	if b := v.Backups; b != nil {
		ch <- prometheus.MustNewConstMetric(c.backupChecked, prometheus.GaugeValue, float64(b.At.Unix()))
		for _, n := range b.Nodes {
			ch <- prometheus.MustNewConstMetric(c.backupProblems, prometheus.GaugeValue, float64(len(n.Problems)), n.Node)
		}
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
