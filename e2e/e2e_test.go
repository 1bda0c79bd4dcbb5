// Package e2e is the whole-system test: what `make demo` shows, without
// the narration, with its outcomes asserted. Real ZooKeeper, real
// PostgreSQL, the real binaries as processes.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

type env struct {
	t    *testing.T
	bin  string
	dir  string
	zk   *testenv.ZK
	pg   *testenv.PG
	args []string // ZooKeeper flags for every binary
	envv []string
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..")
}

func build(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/shardctl", "./cmd/supervisor", "./cmd/router", "./examples/notes", "./examples/notes/loadgen")
	cmd.Dir = repoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
}

func (e *env) cmd(name string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(e.bin, name), args...)
	c.Env = append(os.Environ(), e.envv...)
	return c
}

// run runs a binary to completion and fails the test on a non-zero exit.
func (e *env) run(name string, args ...string) string {
	e.t.Helper()
	c := e.cmd(name, args...)
	out, err := c.CombinedOutput()
	if err != nil {
		e.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// proc is a binary started in the background.
type proc struct {
	*exec.Cmd
	exited chan struct{} // closed when it has exited
}

// start runs a binary in the background, logging to a file; it is stopped
// at the end of the test.
func (e *env) start(name string, args ...string) *proc {
	e.t.Helper()
	return e.startCmd(name, e.cmd(name, args...))
}

// startCmd starts c in the background, logging to logName.log in the
// test's directory; it is stopped (SIGTERM, by its pid) at the end of the
// test.
func (e *env) startCmd(logName string, c *exec.Cmd) *proc {
	e.t.Helper()
	f, err := os.Create(filepath.Join(e.dir, logName+".log"))
	if err != nil {
		e.t.Fatal(err)
	}
	c.Stdout, c.Stderr = f, f
	if err := c.Start(); err != nil {
		e.t.Fatal(err)
	}
	p := &proc{Cmd: c, exited: make(chan struct{})}
	go func() { c.Wait(); close(p.exited) }()
	e.t.Cleanup(func() {
		c.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			c.Process.Kill()
			<-p.exited
		}
		f.Close()
	})
	return p
}

func waitHTTP(t *testing.T, url string, limit time.Duration) {
	t.Helper()
	testenv.WaitFor(t, limit, func() bool {
		res, err := http.Get(url)
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == 200
	}, url+" to answer 200")
}

func metric(t *testing.T, url, name string) string {
	res, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

// stdout runs a binary and returns its standard output alone.
func (e *env) stdout(name string, args ...string) string {
	e.t.Helper()
	c := e.cmd(name, args...)
	var errb strings.Builder
	c.Stderr = &errb
	out, err := c.Output()
	if err != nil {
		e.t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, errb.String())
	}
	return string(out)
}

func TestLongWholeSystem(t *testing.T) {
	testenv.Long(t)
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 4)
	dir := t.TempDir()
	e := &env{t: t, bin: filepath.Join(dir, "bin"), dir: dir, zk: z, pg: pg}
	build(t, e.bin)
	e.envv = []string{"SHARDVISOR_ZK=" + z.ConnectString, "SHARDVISOR_ZK_ROOT=" + z.Root, "SHARDVISOR_CLUSTER=e2e"}
	dsn := func(i int) string { return pg.Nodes[i].DSN }
	pw := "file:" + pg.Nodes[0].PasswordFile

	// A cluster of three db nodes, the app's table, fences, a pool.
	e.run("shardctl", "init", "--level", "5", "--random-seed", "--password", pw,
		"--node", "pg1="+dsn(0), "--node", "pg2="+dsn(1), "--node", "pg3="+dsn(2))
	e.run("shardctl", "table", "add", "app.notes", "--key", "bkey")
	e.run("notes", "schema")
	for _, n := range []string{"pg1", "pg2", "pg3"} {
		e.run("shardctl", "node", "prepare", n)
	}
	appPort, routerPort, adminPort := testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)
	pool := func(workers int) string {
		p := filepath.Join(dir, fmt.Sprintf("pool-%d.json", workers))
		cfg := map[string]any{
			"version": 1, "command": filepath.Join(e.bin, "notes"), "workers": workers,
			"env":              map[string]string{"SHARDVISOR_ZK": z.ConnectString, "SHARDVISOR_ZK_ROOT": z.Root, "SHARDVISOR_CLUSTER": "e2e"},
			"listen":           []map[string]string{{"name": "http", "addr": fmt.Sprintf("tcp://127.0.0.1:%d", appPort)}},
			"graceful_timeout": "15s",
			"readiness":        map[string]string{"mode": "notify", "timeout": "30s"},
		}
		b, _ := json.Marshal(cfg)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	e.run("shardctl", "pool", "set", "notes", "--file", pool(2))

	// The router sidecar and a supervisor running the app, under load.
	e.start("router", "--listen", fmt.Sprintf("127.0.0.1:%d", routerPort))
	e.start("supervisor", "--pool", "notes", "--admin", fmt.Sprintf("127.0.0.1:%d", adminPort), "--state-dir", filepath.Join(dir, "sup"))
	waitHTTP(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", routerPort), 30*time.Second)
	app := fmt.Sprintf("http://127.0.0.1:%d", appPort)
	waitHTTP(t, app+"/healthz", 60*time.Second)
	ledger, summary := filepath.Join(dir, "ledger.jsonl"), filepath.Join(dir, "load.json")
	load := e.start("loadgen", "run", "--url", app, "--users", "150", "--concurrency", "8", "--status-every", "0",
		"--ledger", ledger, "--summary", summary)
	time.Sleep(2 * time.Second) // deliberate: the load runs a while before the swap, so that the swap happens under it

	// A config change swaps worker generations without dropping requests.
	admin := fmt.Sprintf("http://127.0.0.1:%d/metrics", adminPort)
	gen0 := metric(t, admin, "shardvisor_supervisor_generation")
	e.run("shardctl", "pool", "set", "notes", "--file", pool(3))
	testenv.WaitFor(t, 60*time.Second, func() bool {
		g := metric(t, admin, "shardvisor_supervisor_generation")
		return g != "" && g != gen0
	}, "a new worker generation after the config change")

	// A fourth node joins and takes buckets, live, under load.
	e.run("shardctl", "node", "add", "pg4", dsn(3), "--password", pw)
	e.run("notes", "schema")
	e.run("shardctl", "node", "prepare", "pg4")
	out := e.stdout("shardctl", "rebalance", "--json")
	var rep struct {
		Moves []struct {
			State string `json:"state"`
			Stats struct {
				PauseMS float64 `json:"pause_ms"`
			} `json:"stats"`
		} `json:"moves"`
		Balanced bool `json:"balanced"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("rebalance output: %v\n%s", err, out)
	}
	if !rep.Balanced || len(rep.Moves) == 0 {
		t.Fatalf("rebalance: %+v", rep)
	}
	for _, m := range rep.Moves {
		if m.State != "done" {
			t.Fatalf("a move ended %s", m.State)
		}
		t.Logf("move pause %.1f ms", m.Stats.PauseMS)
	}
	time.Sleep(2 * time.Second) // deliberate: the load runs a while on the new map before GC

	// GC prunes what the old owners no longer own, once every member has
	// applied the last map: a move proceeds past a slow member (a
	// straggler), GC rightly does not, and on a loaded machine a
	// supervisor can be a version behind for seconds.
	testenv.WaitFor(t, time.Minute, func() bool {
		return e.cmd("shardctl", "gc", "--grace", "0s", "--dry-run").Run() == nil
	}, "a GC dry run with nothing uncertain (every member on the last map)")
	e.run("shardctl", "gc", "--grace", "0s")

	// Stop the load and check every outcome.
	// loadgen writes the ledger and then the summary as it exits: read
	// them once it has exited, not as soon as the summary file exists.
	load.Process.Signal(syscall.SIGTERM)
	testenv.Receive(t, load.exited, 60*time.Second, "the load generator to write its ledger and summary and exit")
	var sum struct {
		Requests  int64            `json:"requests"`
		Failed    int64            `json:"failed"`
		Writes    int64            `json:"acknowledged_writes"`
		Errors    map[string]int64 `json:"errors"`
		LastError string           `json:"last_error"`
		Retries   int64            `json:"idle_close_retries"`
	}
	data, _ := os.ReadFile(summary)
	if err := json.Unmarshal(data, &sum); err != nil {
		t.Fatalf("load summary %s: %v", data, err)
	}
	t.Logf("load: %d requests, %d failed, %d acknowledged writes, %d resent after a server-closed idle connection", sum.Requests, sum.Failed, sum.Writes, sum.Retries)
	if sum.Requests < 100 || sum.Writes < 50 {
		t.Fatalf("too little load to judge: %s", data)
	}
	if sum.Failed != 0 {
		t.Fatalf("%d requests failed across the swap and the rebalance: %v (last: %s)", sum.Failed, sum.Errors, sum.LastError)
	}
	// Every acknowledged write is on the node that owns its user, and
	// nothing is left on the others after GC.
	vout := e.run("loadgen", "verify", "--ledger", ledger, "--others", "--zk", z.ConnectString, "--zk-root", z.Root, "--cluster", "e2e")
	t.Logf("verify: %s", strings.TrimSpace(vout))

	// No replication slot, publication or subscription left anywhere.
	ctx := context.Background()
	for _, n := range pg.Nodes[:4] {
		c, err := pgx.Connect(ctx, n.DSNWithPassword)
		if err != nil {
			t.Fatal(err)
		}
		var slots, pubs, subs int
		c.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").Scan(&slots)
		c.QueryRow(ctx, "SELECT count(*) FROM pg_publication").Scan(&pubs)
		c.QueryRow(ctx, "SELECT count(*) FROM pg_subscription WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())").Scan(&subs)
		c.Close(ctx)
		if slots+pubs+subs > 0 {
			t.Fatalf("%s: %d slots, %d publications, %d subscriptions left", n.Name, slots, pubs, subs)
		}
	}
}
