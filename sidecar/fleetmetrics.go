package sidecar

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/topo"
)

// The fleet-wide gauges the sidecar exports from what it already holds:
// the fleet view (moves, members behind the map, schema, backups; read
// from ZooKeeper at most once per fleet.DefaultTTL for every scrape and
// page together) and its map (the history of ownership changes whose rows
// wait for GC). Every router exports the same values: alert and record
// them with max, never sum, across routers
// (deploy/prometheus/shardvisor.rules.yml).

// inFlightStates are the move states a move record can be in while the
// move is not finished (a failed move stays, as for GC), and "unreadable"
// for a record that does not decode.
var inFlightStates = func() []string {
	var out []string
	for _, s := range topo.MoveStates {
		if !topo.MoveStateFinal(s) {
			out = append(out, s)
		}
	}
	return append(out, moveUnreadable)
}()

const moveUnreadable = "unreadable"

// stragglerKinds are the member kinds the fleet view counts.
var stragglerKinds = []string{fleet.KindRouter, fleet.KindSupervisor}

// fleetGauges are the values the fleet collector exports from one view.
type fleetGauges struct {
	inFlight     map[string]float64 // by state (inFlightStates), every state present
	stateOldest  map[string]float64 // seconds the longest-waiting move has been in each state; 0: none
	windowOver   float64            // seconds the most overdue rollback window is past its end; 0: none
	lastPause    float64            // the most recently finished move's write pause, seconds
	maxPause     float64            // the longest write pause of the recently finished moves
	stragglers   map[string]float64 // members behind the map, by kind
	behindOldest float64            // seconds the member longest behind the map has been behind
}

// fleetGaugesOf works the gauges out from a view, at now.
func fleetGaugesOf(v *fleet.View, now time.Time) fleetGauges {
	g := fleetGauges{inFlight: map[string]float64{}, stateOldest: map[string]float64{}, stragglers: map[string]float64{}}
	for _, s := range inFlightStates {
		g.inFlight[s], g.stateOldest[s] = 0, 0
	}
	for _, k := range stragglerKinds {
		g.stragglers[k] = 0
	}
	for _, mv := range v.Moves.InFlight {
		st := mv.State
		if _, ok := g.inFlight[st]; !ok {
			st = moveUnreadable
		}
		g.inFlight[st]++
		since := mv.StateSince
		if since.IsZero() {
			since = mv.CreatedAt
		}
		if !since.IsZero() {
			g.stateOldest[st] = max(g.stateOldest[st], now.Sub(since).Seconds())
		}
		if r := mv.Reverse; r != nil && mv.State == topo.MoveReversible && !r.WindowUntil.IsZero() && now.After(r.WindowUntil) {
			g.windowOver = max(g.windowOver, now.Sub(r.WindowUntil).Seconds())
		}
	}
	for i, mv := range v.Moves.Recent {
		p := mv.PauseMS / 1000
		if i == 0 {
			g.lastPause = p
		}
		g.maxPause = max(g.maxPause, p)
	}
	for _, m := range v.Members {
		if !m.Straggler {
			continue
		}
		g.stragglers[m.Kind]++
		if !m.BehindSince.IsZero() {
			g.behindOldest = max(g.behindOldest, now.Sub(m.BehindSince).Seconds())
		}
	}
	return g
}

// fleetCollector exports the fleet view's gauges: the moves, the members
// behind the map, the schema history's states and last drift check, and
// the backup watcher's last check.
type fleetCollector struct {
	changes, drift, backupProblems, backupChecked    *prometheus.Desc
	inFlight, stateOldest, windowOver                *prometheus.Desc
	lastPause, maxPause, stragglers, behind, viewAge *prometheus.Desc
	describe                                         []*prometheus.Desc
	nowFn                                            func() time.Time
	viewFn                                           func(ctx context.Context) *fleet.View
}

func newFleetCollector(h *handler) *fleetCollector {
	const ns = "shardvisor_router_"
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(ns+name, help, labels, nil)
	}
	c := &fleetCollector{nowFn: time.Now, viewFn: h.fleetView,
		changes: d("schema_changes", "Recorded schema changes by state (applied, partial, failed, pending), from the fleet view.", "state"),
		drift:   d("schema_drift_differences", "Differences the last `shardctl schema diff` found (sharded tables, and changes a node lacks); -1 before any."),
		backupProblems: d("backup_node_problems",
			"Backup problems of a db node at the backup watcher's last check (no stanza, archiving off or failing, no backup, newest too old), from the fleet view.", "node"),
		backupChecked: d("backup_checked_timestamp_seconds",
			"When the backup watcher (shardctl restore-point watch) last checked every node's backups (Unix time); absent before any check."),
		inFlight: d("moves_in_flight", "Moves not finished, by state (a failed move stays until `move abort --after-failure`; "+
			"unreadable: a record that does not decode), from the fleet view; every state is exported, at 0 when no move is in it.", "state"),
		stateOldest: d("move_state_oldest_seconds", "Per move state: how long the move longest in that state has been in it (0: no move in it), from the fleet view.", "state"),
		windowOver: d("move_window_overdue_seconds",
			"How long past the end of its rollback window the most overdue move still is (0: none): the window ends by a running `rebalance --watch`."),
		lastPause:  d("move_last_pause_seconds", "The write pause of the most recently finished move (0: none yet), from its record."),
		maxPause:   d("move_recent_pause_max_seconds", "The longest write pause among the 20 most recently finished moves (0: none yet)."),
		stragglers: d("fleet_stragglers", "Members (routers, supervisors) behind this router's map, or whose record does not decode, by kind.", "kind"),
		behind: d("fleet_behind_oldest_seconds",
			"How long the member longest behind this router's map has been behind it (since the first newer map was written; 0: none)."),
		viewAge: d("fleet_view_age_seconds", "Age of the fleet view the gauges above come from (it is read again at most once a second while ZooKeeper answers)."),
	}
	c.describe = []*prometheus.Desc{c.changes, c.drift, c.backupProblems, c.backupChecked, c.inFlight, c.stateOldest, c.windowOver,
		c.lastPause, c.maxPause, c.stragglers, c.behind, c.viewAge}
	return c
}

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.describe {
		ch <- d
	}
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v := c.viewFn(ctx)
	if !v.Available {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, st := range []string{topo.SchemaApplied, topo.SchemaPartial, topo.SchemaFailed, topo.SchemaPending} {
		gauge(c.changes, float64(v.Schema.ByState[st]), st)
	}
	d := -1.0
	if v.Schema.Drift != nil {
		d = float64(v.Schema.Drift.Count)
	}
	gauge(c.drift, d)
	if b := v.Backups; b != nil {
		gauge(c.backupChecked, float64(b.At.Unix()))
		for _, n := range b.Nodes {
			gauge(c.backupProblems, float64(len(n.Problems)), n.Node)
		}
	}
	g := fleetGaugesOf(v, c.nowFn())
	for _, st := range inFlightStates {
		gauge(c.inFlight, g.inFlight[st], st)
		gauge(c.stateOldest, g.stateOldest[st], st)
	}
	gauge(c.windowOver, g.windowOver)
	gauge(c.lastPause, g.lastPause)
	gauge(c.maxPause, g.maxPause)
	for _, k := range stragglerKinds {
		gauge(c.stragglers, g.stragglers[k], k)
	}
	gauge(c.behind, g.behindOldest)
	gauge(c.viewAge, v.AgeSeconds)
}

// gcPending is, per db node, the ownership changes whose rows wait for GC
// on it (the map's history: an entry is pruned once GC deleted its range
// clean) and the age of the oldest.
type gcPending struct {
	ranges, oldest map[string]float64
}

// gcPendingOf works it out from a map, at now: every node of the registry
// not removed is present (at 0 when nothing waits on it), and so is any
// node the history names.
func gcPendingOf(m *bucketmap.Map, now time.Time) gcPending {
	p := gcPending{ranges: map[string]float64{}, oldest: map[string]float64{}}
	for _, n := range m.Nodes() {
		if n.State != bucketmap.NodeRemoved {
			p.ranges[string(n.ID)], p.oldest[string(n.ID)] = 0, 0
		}
	}
	for _, h := range m.History() {
		id := string(h.Node)
		p.ranges[id]++
		p.oldest[id] = max(p.oldest[id], now.Sub(h.At).Seconds())
	}
	return p
}

// gcCollector exports gcPending from the router's map. GC runs as a
// one-shot (a timer, or by hand) with no process to scrape in between;
// what it has left to do is in the map, which every router holds.
type gcCollector struct {
	h              *handler
	ranges, oldest *prometheus.Desc
	nowFn          func() time.Time
}

func newGCCollector(h *handler) *gcCollector {
	return &gcCollector{h: h, nowFn: time.Now,
		ranges: prometheus.NewDesc("shardvisor_router_gc_pending_ranges",
			"Ownership changes (the map's history entries) whose rows still wait for GC on the db node that lost them.", []string{"node"}, nil),
		oldest: prometheus.NewDesc("shardvisor_router_gc_pending_oldest_seconds",
			"Age of the oldest ownership change whose rows still wait for GC on the db node (0: none); GC deletes only after its grace (1h by default).",
			[]string{"node"}, nil)}
}

func (c *gcCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.ranges; ch <- c.oldest }

func (c *gcCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.h.r.Map()
	if m == nil {
		return
	}
	p := gcPendingOf(m, c.nowFn())
	for node, n := range p.ranges {
		ch <- prometheus.MustNewConstMetric(c.ranges, prometheus.GaugeValue, n, node)
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, p.oldest[node], node)
	}
}
