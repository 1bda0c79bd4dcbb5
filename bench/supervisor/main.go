// Command supervisor-bench compares code reloads under load: gunicorn alone
// (the baseline) against the supervisor running the same gunicorn app
// (versioned_app.py), and the Go example worker; then each worker's steady
// throughput bound directly vs under the supervisor. Run it with
// bench/supervisor/run; docs/supervisor.md ("Benchmark") says how and what
// each figure means.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/topo"
)

var (
	reloads    = flag.Int("reloads", 50, "reloads per scenario")
	spacing    = flag.Duration("spacing", 3*time.Second, "time between reloads (wider than the start-up time)")
	stormFor   = flag.Duration("storm", 20*time.Second, "storm duration")
	stormEvery = flag.Duration("storm-every", time.Second, "time between changes during the storm")
	startup    = flag.Duration("startup", 1500*time.Millisecond, "app start-up time (sleep at import)")
	workers    = flag.Int("workers", 4, "serving processes in every scenario")
	// Off by default, like gunicorn alone: with a window the previous
	// generation answers beside the new one for its length, by design.
	window    = flag.Duration("stability-window", 0, "the pool config's stability.window (0: off, like gunicorn alone; the supervisor's default is 10s)")
	conc      = flag.Int("c", 8, "connections of wrk (steady-state throughput)")
	rate      = flag.Int("rate", 200, "constant offered load during reloads and storms, requests/s")
	steadyFor = flag.Duration("steady", 5*time.Second, "steady-state measurement time")
	zkConnect = flag.String("zk", cliutil.LocalZK, "ZooKeeper connect string")
	repo      = flag.String("repo", ".", "repository root")
	only      = flag.String("only", scenarios, "scenarios to run, comma-separated: gunicorn (alone, the baseline), supervisor+gunicorn, supervisor+go, direct (steady throughput bound directly vs under the supervisor)")
	pinCPUs   = flag.Bool("pin", runtime.NumCPU() >= 2, "in the direct comparison, pin the servers to the first CPU and wrk to the others (taskset), so that the load generator and the servers do not trade cores from round to round")
	rounds    = flag.Int("rounds", 15, "paired wrk rounds in the direct comparison (order alternating; the median of the rounds' ratios counts)")
	jsonOut   = flag.String("json", "", "also write the results as JSON to this file")
)

const scenarios = "gunicorn,supervisor+gunicorn,supervisor+go,direct"

func main() {
	flag.Parse()
	if err := run(); err != nil {
		benchkit.Fatalf(1, "bench", "%v", err)
	}
}

// phase is one stretch of load: the spaced reloads, or the storm.
type phase struct {
	Sent    int     `json:"sent"`
	Failed  int     `json:"failed"` // non-2xx answers + connection errors
	Non2xx  int     `json:"non_2xx"`
	ConnErr int     `json:"conn_errors"`
	P50MS   float64 `json:"p50_ms"`
	P99MS   float64 `json:"p99_ms"`
	MaxMS   float64 `json:"slowest_ms"`
	// Storm only: successful answers completed while the changes were
	// being made, per second.
	RPS float64 `json:"rps,omitempty"`
	// Time from a change (version write, then HUP or config write) to the
	// first answer carrying the new version, and to the answer from which
	// on every answer carries it. Reloads: over every change; storm: the
	// last change only (earlier ones are overtaken).
	Changes    int     `json:"changes"`
	FirstSeen  int     `json:"first_seen"` // changes whose version answered at all
	AllNew     int     `json:"all_new"`    // changes after which only their version answered
	FirstP50MS float64 `json:"first_p50_ms"`
	FirstMaxMS float64 `json:"first_max_ms"`
	AllP50MS   float64 `json:"all_p50_ms"`
	AllMaxMS   float64 `json:"all_max_ms"`
	// Storm only: how many of its versions answered at least one request.
	VersionsServed int `json:"versions_served,omitempty"`
}

type scenario struct {
	Name       string  `json:"name"`
	Reload     string  `json:"reload"`
	SteadyRPS  float64 `json:"steady_rps"`
	Reloads    phase   `json:"reloads"`
	Storm      phase   `json:"storm"`
	LoadBefore string  `json:"loadavg_before"`
	LoadAfter  string  `json:"loadavg_after"`
}

func run() error {
	root, err := filepath.Abs(*repo)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "sv-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for _, cmd := range []string{"gunicorn", "wrk"} {
		if _, err := exec.LookPath(cmd); err != nil {
			return fmt.Errorf("%s is missing: run scripts/install-deps", cmd)
		}
	}
	want := map[string]bool{}
	for _, o := range strings.Split(*only, ",") {
		if o = strings.TrimSpace(o); !slices.Contains(strings.Split(scenarios, ","), o) {
			return fmt.Errorf("-only: unknown scenario %q (want %s)", o, strings.ReplaceAll(scenarios, ",", ", "))
		}
		want[o] = true
	}
	if *rounds < 1 {
		return fmt.Errorf("-rounds must be at least 1")
	}
	svBin, hello := filepath.Join(tmp, "supervisor"), filepath.Join(tmp, "hello")
	for pkg, out := range map[string]string{"./cmd/supervisor": svBin, "./examples/hello": hello} {
		c := exec.Command("go", "build", "-o", out, pkg)
		c.Dir, c.Stderr = root, os.Stderr
		if err := c.Run(); err != nil {
			return fmt.Errorf("go build %s: %w", pkg, err)
		}
	}
	sess, err := clustertest.OpenSession(context.Background(), *zkConnect, "scripts/devenv --plain up")
	if err != nil {
		return err
	}
	defer sess.Close()
	benchRoot := fmt.Sprintf("/shardvisor-bench-%d", os.Getpid())
	paths := topo.MustPaths(benchRoot, "bench")
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = topo.DeleteRoot(ctx, sess, paths)
	}()
	appDir := filepath.Join(root, "examples/python")
	benchDir := filepath.Join(root, "bench/supervisor") // versioned_app.py
	startupEnv := strconv.FormatFloat(startup.Seconds(), 'f', 3, 64)
	// versionFile writes version n where a new import of the app reads it
	// (write and rename: a worker importing right then reads whole files).
	versionFile := func(name string, n int) (string, error) {
		f := filepath.Join(tmp, name)
		if err := os.WriteFile(f+".tmp", []byte(strconv.Itoa(n)+"\n"), 0o644); err != nil {
			return "", err
		}
		return f, os.Rename(f+".tmp", f)
	}

	loadStart := benchkit.LoadAvg(3)
	var rows []scenario
	// runScenario serves on port with cmd, measures it and stops it.
	runScenario := func(name, how string, cmd *exec.Cmd, port int, within time.Duration, apply func(n int) error) error {
		stop, err := serve(cmd, port, within)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		defer stop()
		rows = append(rows, measure(name, how, httpURL(port), apply))
		return nil
	}

	// gunicorn alone, the baseline: one version file for all generations.
	if want["gunicorn"] {
		port := freePort()
		vf, err := versionFile("gunicorn-version", 0)
		if err != nil {
			return err
		}
		cmd := exec.Command("gunicorn", "--workers", strconv.Itoa(*workers), "--bind", fmt.Sprintf("127.0.0.1:%d", port),
			"--chdir", benchDir, "--graceful-timeout", "10", "--log-level", "warning", "versioned_app:application")
		cmd.Env = append(os.Environ(), "APP_STARTUP_DELAY="+startupEnv, "APP_VERSION_FILE="+vf)
		cmd.Stderr = logFile(tmp, "gunicorn.log")
		hup := func(n int) error {
			if _, err := versionFile("gunicorn-version", n); err != nil {
				return err
			}
			return cmd.Process.Signal(syscall.SIGHUP)
		}
		if err := runScenario("gunicorn alone", fmt.Sprintf("gunicorn --workers %d (no --preload); version file + SIGHUP", *workers), cmd, port, 30*time.Second, hup); err != nil {
			return err
		}
	}
	// The supervisor with gunicorn, then with the Go worker: a change is a
	// pool config write whose env holds the new version.
	pyEnv := map[string]string{"APP_STARTUP_DELAY": startupEnv}
	goEnv := map[string]string{"HELLO_STARTUP_DELAY": startup.String()}
	for i, sc := range []struct {
		name, how, command string
		args               []string
		env                map[string]string
		version            func(n int) error // puts version n into env
		settle             time.Duration     // readiness.delay: gunicorn's arbiter notifies before forking its workers
	}{
		{"supervisor+gunicorn", fmt.Sprintf("%d x gunicorn --preload --workers 1; new version file named in the pool config's env", *workers), "gunicorn",
			[]string{"--preload", "--workers", "1", "--chdir", benchDir, "--graceful-timeout", "10", "--log-level", "warning", "versioned_app:application"},
			pyEnv, func(n int) error {
				// A file per version: the running generation keeps its own.
				f, err := versionFile(fmt.Sprintf("sv-gunicorn-version-%d", n), n)
				pyEnv["APP_VERSION_FILE"] = f
				return err
			}, 300 * time.Millisecond},
		{"supervisor+go", fmt.Sprintf("%d x the Go example worker; version in the pool config's env (GREETING)", *workers), hello, nil,
			goEnv, func(n int) error { goEnv["GREETING"] = fmt.Sprintf("v%d", n); return nil }, 0},
	} {
		if !want[sc.name] {
			continue
		}
		pool := fmt.Sprintf("p%d", i)
		port, admin := freePort(), freePort()
		cfg := &topo.PoolConfig{Version: 1, Command: sc.command, Args: sc.args, Env: sc.env, Workers: *workers, Surge: new(*workers),
			Stability: topo.Stability{Window: new(topo.Duration(*window))},
			Listen:    []topo.Listen{{Name: "http", Addr: fmt.Sprintf("tcp://127.0.0.1:%d", port)}}, GracefulTimeout: topo.Duration(15 * time.Second),
			Readiness: topo.Readiness{Timeout: topo.Duration(30 * time.Second), Delay: topo.Duration(sc.settle)}}
		setCfg := func(n int) error {
			if err := sc.version(n); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _, err := topo.SetPoolConfig(ctx, sess, paths, pool, cfg, -1)
			return err
		}
		if err := setCfg(0); err != nil {
			return err
		}
		cmd := exec.Command(svBin, "--zk", *zkConnect, "--zk-root", benchRoot, "--cluster", "bench", "--pool", pool,
			"--admin", fmt.Sprintf("127.0.0.1:%d", admin), "--state-dir", filepath.Join(tmp, pool), "--log-level", "warn")
		cmd.Stdout, cmd.Stderr = logFile(tmp, pool+".log"), logFile(tmp, pool+".err.log")
		if err := runScenario(sc.name, sc.how, cmd, port, time.Minute, setCfg); err != nil {
			return err
		}
	}

	// Bound directly vs under the supervisor: the same worker, same count.
	var direct []directRow
	if want["direct"] {
		direct = directComparison(tmp, hello, svBin, appDir)
	}

	loadEnd := benchkit.LoadAvg(3)
	gv, _ := exec.Command("gunicorn", "--version").Output()
	conditions := fmt.Sprintf("%d CPUs, load average (1/5/15 min) %s at start, %s at end; %s, %s, %s",
		runtime.NumCPU(), loadStart, loadEnd, runtime.Version(), strings.TrimSpace(string(gv)), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	printTable(rows, direct, conditions)
	if *jsonOut == "" {
		return nil
	}
	b, _ := json.MarshalIndent(map[string]any{"command": commandLine(), "conditions": conditions, "baseline": "gunicorn alone", "scenarios": rows, "direct": direct,
		"settings": map[string]any{"workers": *workers, "rate": *rate, "startup": startup.String(), "reloads": *reloads, "spacing": spacing.String(),
			"storm": stormFor.String(), "storm_every": stormEvery.String(), "rounds": *rounds, "pin": *pinCPUs}}, "", "  ")
	return os.WriteFile(*jsonOut, append(b, '\n'), 0o644)
}

func commandLine() string {
	return strings.TrimSpace("bench/supervisor/run " + strings.Join(os.Args[1:], " "))
}

func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func httpURL(port int) string { return fmt.Sprintf("http://127.0.0.1:%d/", port) }

// serve starts cmd and waits until it answers 200 on port; stop stops it.
func serve(cmd *exec.Cmd, port int, within time.Duration) (stop func(), err error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stop = func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if resp, err := httpClient.Get(httpURL(port)); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return stop, nil
			}
		}
	}
	stop()
	return nil, fmt.Errorf("%s not serving within %s", httpURL(port), within)
}

func logFile(dir, name string) *os.File {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		panic(err)
	}
	return f
}
