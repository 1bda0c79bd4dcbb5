package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/promtest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// The alerts the observability test makes fire, each by its fault.
const (
	alertFrozen      = "ShardvisorBucketFrozen"
	alertMemberGone  = "ShardvisorGroupMemberMissing"
	alertNoSyncStand = "ShardvisorGroupNoSyncStandby"
)

// maxFor caps every `for:` (and group `interval:`) of deploy/prometheus's
// rules in the copies the test's Prometheus loads: the shipped durations
// (up to minutes, so that a blip does not page) would make the test wait
// them out. Only the durations change, never an expression, and the test
// logs each rewrite, shipped and shortened.
const maxFor = 3 * time.Second

// obs is the cluster the observability test runs: every long-running
// process of shardvisor, scraped by a Prometheus of its own.
type obs struct {
	*env
	group  *testenv.PGNode
	fpBin  string // shardctl built with -tags failpoints
	router string // the router's base URL
	prom   *promtest.Server
	since  time.Time // when Prometheus started
	jobs   []promtest.Job
	// watchers: their metrics addresses, in the order of watchers.
	watchers []string
	// summary: a line per result, logged together at the end.
	summary []string
}

// TestFaultsObservability runs the cluster as production does (two
// supervisors running the notes app under load, the router sidecar, the
// watchers: rebalance --watch, node reconcile --watch, periodic GC) on two
// plain db nodes and a Patroni group, with Debian's Prometheus scraping
// every process and loading deploy/prometheus's rules, and checks what an
// operator would rely on:
//
//   - every target is up;
//   - three faults make their alerts fire, and healing them resolves
//     them: a mover killed inside its write pause (a frozen bucket, until
//     rebalance --watch resumes the move), a group member stopped (its
//     Patroni and PostgreSQL, by pid), and a group left without a
//     synchronous standby; the time from each fault to its alert firing,
//     and from the heal to the alert resolved, is logged;
//   - every recording rule and every query of deploy/grafana's dashboard
//     parses and has data over the run, as the dashboard would draw it.
//
// The rules' `for:` durations are shortened in the loaded copies
// (maxFor); their expressions are the shipped ones.
func TestFaultsObservability(t *testing.T) {
	testenv.Faults(t)
	testenv.Exclusive(t) // the member and synchronous-standby faults
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	group := testenv.StartPGGroups(t, 1).Nodes[0]
	dir := t.TempDir()
	o := &obs{env: &env{t: t, bin: filepath.Join(dir, "bin"), dir: dir, zk: z, pg: pg}, group: group, fpBin: filepath.Join(dir, "fp")}
	build(t, o.bin)
	buildFailpoints(t, o.fpBin)
	o.envv = []string{"SHARDVISOR_ZK=" + z.ConnectString, "SHARDVISOR_ZK_ROOT=" + z.Root, "SHARDVISOR_CLUSTER=obs"}
	o.startCluster()
	o.startPrometheus()
	o.startWatchers()
	o.targetsUp()
	o.awaitRebalance()

	// The faults, each in a subtest: one that fails leaves the others
	// (and the queries' report) to run.
	t.Run("frozen-bucket", func(t *testing.T) { o.frozenBucket(t) })
	t.Run("member-missing", func(t *testing.T) { o.memberMissing(t) })
	t.Run("no-sync-standby", func(t *testing.T) { o.noSyncStandby(t) })
	t.Run("queries", func(t *testing.T) { o.queries(t) })
	o.logAlerts()
	t.Logf("summary:\n%s", strings.Join(o.summary, "\n"))
}

func buildFailpoints(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-tags", "failpoints", "-o", dir+"/", "./cmd/shardctl")
	cmd.Dir = repoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build with failpoints: %v\n%s", err, out)
	}
}

// startCluster creates the cluster on pg1 and pg2 and starts its
// processes: the router, two supervisors (a pool each: they share this
// host's ports) under load, and the watchers with their metrics served.
func (o *obs) startCluster() {
	t, pg, z := o.t, o.pg, o.zk
	pw := "file:" + pg.Nodes[0].PasswordFile
	o.run("shardctl", "init", "--level", "3", "--random-seed", "--password", pw,
		"--node", "pg1="+pg.Nodes[0].DSN, "--node", "pg2="+pg.Nodes[1].DSN,
		"--pool", "pg1="+pg.Nodes[0].PoolDSN, "--pool", "pg2="+pg.Nodes[1].PoolDSN)
	// The app's schema recorded (node prepare replays it on pg5), as the
	// demo does.
	o.run("shardctl", "schema", "apply", filepath.Join(repoRoot(), "examples", "notes", "schema", "001-notes.sql"))
	o.run("shardctl", "table", "add", "app.notes", "--key", "bkey")
	for _, n := range []string{"pg1", "pg2"} {
		o.run("shardctl", "node", "prepare", n)
	}
	// The group, a third node with no buckets yet: rebalance --watch,
	// once started, moves buckets to it under load.
	g := o.group
	o.run("shardctl", "node", "add", "pg5", g.DSN, "--pool-dsn", g.PoolDSN, "--password", "file:"+g.PasswordFile,
		"--patroni-scope", g.PatroniScope, "--patroni-namespace", g.PatroniNamespace)
	o.run("shardctl", "node", "prepare", "pg5")
	// Backups: every node's stanza in the environment's pgBackRest
	// repository, and a first backup of each, for the backup watcher
	// (restore-point watch) to check.
	pgbr, cfg := testenv.PGBackRest(t)
	o.envv = append(o.envv, "SHARDVISOR_PGBACKREST="+strings.Join(pgbr, " "), "SHARDVISOR_PGBACKREST_CONFIG="+cfg)
	for id, n := range map[string]*testenv.PGNode{"pg1": pg.Nodes[0], "pg2": pg.Nodes[1], "pg5": g} {
		o.run("shardctl", "backup", "configure", id, "--stanza", testenv.Stanza(n))
	}
	o.run("shardctl", "backup", "pg1", "pg2", "pg5")
	routerPort := testenv.FreePort(t)
	o.router = fmt.Sprintf("http://127.0.0.1:%d", routerPort)
	o.start("router", "--listen", fmt.Sprintf("127.0.0.1:%d", routerPort), "--id", "router1")
	var sup []string
	for i := 0; i < 2; i++ {
		appPort, adminPort := testenv.FreePort(t), testenv.FreePort(t)
		cfg := map[string]any{
			"version": 1, "command": filepath.Join(o.bin, "notes"), "workers": 2,
			"env":              map[string]string{"SHARDVISOR_ZK": z.ConnectString, "SHARDVISOR_ZK_ROOT": z.Root, "SHARDVISOR_CLUSTER": "obs"},
			"listen":           []map[string]string{{"name": "http", "addr": fmt.Sprintf("tcp://127.0.0.1:%d", appPort)}},
			"graceful_timeout": "15s",
			"readiness":        map[string]string{"mode": "notify", "timeout": "30s"},
			"map_delivery":     map[string]string{"mode": "reload", "ack_timeout": "5s"},
		}
		p := filepath.Join(o.dir, fmt.Sprintf("pool%d.json", i))
		b, _ := json.Marshal(cfg)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		pool := fmt.Sprintf("notes%d", i)
		o.run("shardctl", "pool", "set", pool, "--file", p)
		o.startAs(fmt.Sprintf("supervisor%d", i), "supervisor", "--pool", pool, "--member", fmt.Sprintf("web%d", i+1),
			"--admin", fmt.Sprintf("127.0.0.1:%d", adminPort), "--state-dir", filepath.Join(o.dir, fmt.Sprintf("sup%d", i)))
		sup = append(sup, fmt.Sprintf("127.0.0.1:%d", adminPort))
		app := fmt.Sprintf("http://127.0.0.1:%d", appPort)
		waitHTTP(t, app+"/healthz", 90*time.Second)
		o.startAs(fmt.Sprintf("loadgen%d", i), "loadgen", "run", "--url", app, "--users", "100", "--concurrency", "3",
			"--rate", "40", "--status-every", "0", "--prefix", fmt.Sprintf("web%d-user", i),
			"--ledger", filepath.Join(o.dir, fmt.Sprintf("ledger%d.jsonl", i)), "--summary", filepath.Join(o.dir, fmt.Sprintf("load%d.json", i)))
	}
	waitHTTP(t, o.router+"/readyz", 30*time.Second)
	w := promtest.Job{Name: "shardvisor-watchers"}
	for _, wt := range watchers {
		addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		o.watchers = append(o.watchers, addr)
		// As deploy/prometheus/prometheus.example.yml labels them.
		w.Static = append(w.Static, promtest.Static{Targets: []string{addr}, Labels: map[string]string{"watcher": wt.name}})
	}
	o.jobs = []promtest.Job{
		{Name: "shardvisor-supervisor", Static: []promtest.Static{promtest.Targets(sup...)}},
		{Name: "shardvisor-router", Static: []promtest.Static{promtest.Targets(fmt.Sprintf("127.0.0.1:%d", routerPort))}},
		w,
	}
}

// watchers are the cluster's watchers, each serving its metrics: the
// three of deploy/prometheus/prometheus.example.yml, and GC in its
// periodic mode (which the example says can be added).
var watchers = []struct {
	name string
	args []string
}{
	{"rebalance", []string{"rebalance", "--watch"}},
	{"reconcile", []string{"node", "reconcile", "--watch"}},
	{"restore-point", []string{"restore-point", "watch", "--every", "20s", "--check-every", "5s"}},
	{"gc", []string{"gc", "--every", "5s", "--grace", "0s"}},
}

// startWatchers starts the watchers, after Prometheus: it sees the
// rebalance they start with.
func (o *obs) startWatchers() {
	for i, w := range watchers {
		o.startAs(w.name, "shardctl", append(w.args, "--metrics-addr", o.watchers[i])...)
	}
}

// startAs is start with a log of its own name (two of one binary run).
func (o *obs) startAs(logName, name string, args ...string) *proc {
	o.t.Helper()
	c := o.cmd(name, args...)
	return o.startCmd(logName, c)
}

// ruleFiles are deploy/prometheus's rule files: every YAML file there
// with a top-level groups key (prometheus.example.yml is a server's
// configuration, not rules).
func ruleFiles(t *testing.T) []string {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(repoRoot(), "deploy", "prometheus", "*.y*ml"))
	var out []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(string(b), "groups:") || strings.Contains(string(b), "\ngroups:") {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no rule files in %s", filepath.Join(repoRoot(), "deploy", "prometheus"))
	}
	return out
}

func (o *obs) startPrometheus() {
	t := o.t
	o.prom = promtest.Start(t, promtest.Config{Jobs: o.jobs, RuleFiles: ruleFiles(t), MaxFor: maxFor})
	o.since = time.Now()
	for _, r := range o.prom.Rewrites {
		t.Logf("for: rewritten in the test's copy: %s", r)
	}
	t.Logf("prometheus %s (pid %d), rules %v", o.prom.URL, o.prom.Pid, o.prom.RuleFiles)
}

// targetsUp waits until Prometheus scrapes every target.
func (o *obs) targetsUp() {
	t := o.t
	want := 0
	for _, j := range o.jobs {
		for _, st := range j.Static {
			want += len(st.Targets)
		}
	}
	var last []promtest.Target
	ok := waitUntil(90*time.Second, func() bool {
		ts, err := o.prom.Targets(context.Background())
		if err != nil {
			return false
		}
		last = ts
		up := 0
		for _, tg := range ts {
			if tg.Health == "up" {
				up++
			}
		}
		return len(ts) == want && up == want
	})
	var lines []string
	up := 0
	for _, tg := range last {
		if tg.Health == "up" {
			up++
		}
		lines = append(lines, fmt.Sprintf("%s %s: %s %s", tg.ScrapePool, tg.ScrapeURL, tg.Health, tg.LastError))
	}
	sort.Strings(lines)
	if !ok {
		t.Fatalf("targets: %d of %d up after 90 s:\n%s", up, want, strings.Join(lines, "\n"))
	}
	t.Logf("targets: %d of %d up", up, want)
}

// awaitRebalance waits until rebalance --watch has moved buckets to the
// group (and so balanced the cluster): the moves' metrics have samples,
// and GC prunes the old copies.
func (o *obs) awaitRebalance() {
	t := o.t
	if !waitUntil(3*time.Minute, func() bool { return o.balanced() && len(o.movesTo("pg5")) > 0 }) {
		t.Fatalf("rebalance --watch did not balance the cluster onto pg5 within 3 minutes:\n%s", o.stdout("shardctl", "moves"))
	}
	t.Logf("rebalance --watch moved %d buckets to pg5", len(o.movesTo("pg5")))
}

// moveRec is what the test reads of `shardctl moves --json`.
type moveRec struct {
	ID     string `json:"id"`
	Bucket uint32 `json:"bucket"`
	Source string `json:"source"`
	Target string `json:"target"`
	State  string `json:"state"`
}

func (m moveRec) finished() bool { return topo.MoveStateFinal(m.State) || m.State == topo.MoveFailed }

func (o *obs) moves() []moveRec {
	out, err := o.cmd("shardctl", "moves", "--json").Output()
	var ms []moveRec
	if err != nil || json.Unmarshal(out, &ms) != nil {
		return nil
	}
	return ms
}

func (o *obs) movesTo(node string) []moveRec {
	var out []moveRec
	for _, m := range o.moves() {
		if m.Target == node && m.State == "done" {
			out = append(out, m)
		}
	}
	return out
}

// balanced: the planner has nothing to do and no move is unfinished.
func (o *obs) balanced() bool {
	out, err := o.cmd("shardctl", "rebalance", "--dry-run", "--json").Output()
	var p struct {
		Moves    []json.RawMessage `json:"moves"`
		Reassign []json.RawMessage `json:"reassign"`
		Splits   int               `json:"splits"`
	}
	if err != nil || json.Unmarshal(out, &p) != nil || len(p.Moves)+len(p.Reassign)+p.Splits > 0 {
		return false
	}
	for _, m := range o.moves() {
		if !m.finished() {
			return false
		}
	}
	return true
}

// waitUntil polls cond every 250 ms until it is true (true) or limit
// passes (false).
func waitUntil(limit time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(limit); ; time.Sleep(250 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// alertState is an alert's state in /api/v1/alerts now ("inactive" when
// not listed).
func (o *obs) alertState(name string) (string, promtest.Alert) {
	alerts, err := o.prom.Alerts(context.Background())
	if err != nil {
		return "unknown: " + err.Error(), promtest.Alert{}
	}
	return promtest.AlertState(alerts, name)
}

// awaitAlert waits up to limit for alert name to be in state (firing, or
// inactive: resolved) and returns when it saw it; it fails t if it did not
// come, saying what the alert and its rule's query showed.
func (o *obs) awaitAlert(t *testing.T, name, state string, since time.Time, limit time.Duration) time.Duration {
	t.Helper()
	var last string
	var inst promtest.Alert
	if !waitUntil(limit, func() bool { last, inst = o.alertState(name); return last == state }) {
		t.Fatalf("%s: %s after %s, not %s (rule: %s)", name, last, limit, state, o.ruleSummary(name))
	}
	d := time.Since(since)
	if state == "firing" {
		t.Logf("%s firing %.1f s after the fault (%s; labels %v, value %s, pending from %.1f s)", name, d.Seconds(), o.forOf(name),
			inst.Labels, inst.Value, inst.ActiveAt.Sub(since).Seconds())
	}
	return d
}

// alertAt watches alert name in the background from now on, polling
// every 250 ms, and delivers when it first saw it in state (or the zero
// time if it did not within limit): for a heal the test performs by a
// call that returns only later (the alert may resolve meanwhile).
func (o *obs) alertAt(name, state string, limit time.Duration) <-chan time.Time {
	c := make(chan time.Time, 1)
	go func() {
		var at time.Time
		waitUntil(limit, func() bool {
			st, _ := o.alertState(name)
			if st == state {
				at = time.Now()
			}
			return !at.IsZero()
		})
		c <- at
	}()
	return c
}

// resolvedAt waits for what alertAt delivers and fails t if the alert
// did not resolve.
func (o *obs) resolvedAt(t *testing.T, name string, c <-chan time.Time) time.Time {
	t.Helper()
	at := <-c
	if at.IsZero() {
		st, _ := o.alertState(name)
		t.Fatalf("%s: still %s after the heal (rule: %s)", name, st, o.ruleSummary(name))
	}
	return at
}

// forOf says alert name's `for:` as shipped and as loaded.
func (o *obs) forOf(name string) string {
	for _, r := range o.prom.Rewrites {
		if r.Rule == name && r.Key == "for" {
			return fmt.Sprintf("for: %s shipped, %s loaded", r.From, r.To)
		}
	}
	return "for: as shipped"
}

// ruleSummary is alert name's rule as the server evaluates it, and what
// its query returns now.
func (o *obs) ruleSummary(name string) string {
	ctx := context.Background()
	groups, err := o.prom.Rules(ctx)
	if err != nil {
		return err.Error()
	}
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Type == "alerting" && r.Name == name {
				res, err := o.prom.Query(ctx, r.Query)
				return fmt.Sprintf("%s for %s, health %s %s; query now: %s %v", r.Query, r.For(), r.Health, r.LastError, describe(res), err)
			}
		}
	}
	return "no alerting rule named " + name + " is loaded"
}

// describe shows a result's series in one line.
func describe(r promtest.Result) string {
	var s []string
	for _, v := range r.Vector {
		s = append(s, fmt.Sprintf("%v=%g", v.Metric, v.Value))
	}
	if r.Scalar != nil {
		s = append(s, fmt.Sprintf("%g", r.Scalar.Value))
	}
	for _, m := range r.Matrix {
		s = append(s, fmt.Sprintf("%v (%d points)", m.Metric, len(m.Points)))
	}
	if len(s) == 0 {
		return "(empty)"
	}
	return strings.Join(s, ", ")
}

// logAlerts logs every alert active at the end, whatever its cause.
func (o *obs) logAlerts() {
	alerts, err := o.prom.Alerts(context.Background())
	if err != nil {
		o.t.Logf("alerts: %v", err)
		return
	}
	var lines []string
	for _, a := range alerts {
		lines = append(lines, fmt.Sprintf("%s %s %v", a.Name(), a.State, a.Labels))
	}
	sort.Strings(lines)
	o.t.Logf("alerts active at the end: %d\n%s", len(alerts), strings.Join(lines, "\n"))
	if len(alerts) > 0 {
		// What the cluster says of itself, to read the alerts by.
		out, _ := o.cmd("shardctl", "status").CombinedOutput()
		o.t.Logf("shardctl status:\n%s", out)
	}
}

// routeOf asks the router which node and bucket hold uid.
func (o *obs) routeOf(uid string) (node string, bucket uint32, err error) {
	res, err := http.Get(o.router + "/v1/route?uid=" + uid)
	if err != nil {
		return "", 0, err
	}
	defer res.Body.Close()
	var r struct {
		Node   string `json:"node"`
		Bucket uint32 `json:"bucket"`
	}
	err = json.NewDecoder(res.Body).Decode(&r)
	return r.Node, r.Bucket, err
}
