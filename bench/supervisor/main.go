// Command supervisor-bench compares code reloads under load: gunicorn alone
// against shardvisor's supervisor (cmd/supervisor) running the same gunicorn
// app, and the Go example worker. The app (bench/supervisor/versioned_app.py,
// examples/python/wsgi_app plus a version) takes STARTUP (1.5 s) to import
// and answers with the version it was imported with, so a reload counts only
// once answers prove that new code serves. Run it with `make bench-supervisor`
// or bench/supervisor/run; it needs the local ZooKeeper (scripts/devenv up)
// and gunicorn, wrk (scripts/install-deps).
//
// How each side reloads:
//   - gunicorn alone runs WITHOUT --preload and is reloaded the way its
//     users reload code: write the new version, SIGHUP. Its new workers
//     import the app afresh. With --preload a HUP forks new workers from an
//     arbiter that already imported the app, so no code is reloaded at all.
//   - the supervisor is reloaded by a pool config change in ZooKeeper (the
//     env names the new version's file); each swap starts new gunicorn
//     processes, which import the app. They run --preload only so that
//     gunicorn's READY=1 comes after the import.
//
// Both import the app four times per reload (4 workers, 4 x 1 under the
// supervisor). Only the direct-throughput comparison, where nothing is
// reloaded, runs --preload on both sides.
//
// Two load generators: Debian's wrk measures steady-state throughput (the
// "bound directly vs under the supervisor" comparison, where the load
// generator's own efficiency matters); during reloads and storms an
// open-loop generator in this program offers a constant rate and records
// every request (when it was due, latency, status or connection error,
// version), because per-request timelines are needed to tell when new code
// serves, which neither wrk nor hey report. Latency counts from the moment
// a request was due, so a stall is charged in full (no coordinated
// omission).
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
	// gunicorn alone has no stability window: it swaps its workers the
	// moment they boot. The like-for-like comparison of time to new code
	// runs the supervisor without one too; the default 10 s window keeps
	// the previous generation answering beside the new one for 10 s by
	// design, so "all answers from new code" would read >= 10 s.
	window    = flag.Duration("stability-window", 0, "the pool config's stability.window (0: off, like gunicorn alone; the supervisor's default is 10s)")
	conc      = flag.Int("c", 8, "connections of wrk (steady-state throughput)")
	rate      = flag.Int("rate", 200, "constant offered load during reloads and storms, requests/s")
	steadyFor = flag.Duration("steady", 5*time.Second, "steady-state measurement time")
	zkConnect = flag.String("zk", cliutil.LocalZK, "ZooKeeper connect string")
	repo      = flag.String("repo", ".", "repository root")
	only      = flag.String("only", "gunicorn,supervisor+gunicorn,supervisor+go,direct", "scenarios to run, comma-separated: gunicorn (alone, the baseline), supervisor+gunicorn, supervisor+go, direct (steady throughput bound directly vs under the supervisor)")
	pinCPUs   = flag.Bool("pin", runtime.NumCPU() >= 2, "in the direct comparison, pin the servers to the first CPU and wrk to the others (taskset), so that the load generator and the servers do not trade cores from round to round")
	rounds    = flag.Int("rounds", 15, "paired wrk rounds in the direct comparison (order alternating; the median of the rounds' ratios counts)")
	jsonOut   = flag.String("json", "", "also write the results as JSON to this file")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
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
		switch o = strings.TrimSpace(o); o {
		case "gunicorn", "supervisor+gunicorn", "supervisor+go", "direct":
			want[o] = true
		default:
			return fmt.Errorf("-only: unknown scenario %q (want gunicorn, supervisor+gunicorn, supervisor+go, direct)", o)
		}
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
	sess, err := clustertest.OpenSession(context.Background(), *zkConnect, "scripts/devenv up")
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

	loadStart := loadavg()
	fmt.Printf("supervisor benchmark: %d workers, constant load %d req/s (keep-alive; gunicorn closes after each response), start-up %s, %d reloads every %s, storm: a change every %s for %s; load average at start %s\n\n",
		*workers, *rate, *startup, *reloads, *spacing, *stormEvery, *stormFor, loadStart)
	var rows []scenario

	// gunicorn alone, the baseline: no --preload, so that a HUP imports the
	// new code; the version file is shared by all its generations.
	if want["gunicorn"] {
		port := freePort()
		url := fmt.Sprintf("http://127.0.0.1:%d/", port)
		vf, err := versionFile("gunicorn-version", 0)
		if err != nil {
			return err
		}
		cmd := exec.Command("gunicorn", "--workers", strconv.Itoa(*workers), "--bind", fmt.Sprintf("127.0.0.1:%d", port),
			"--chdir", benchDir, "--graceful-timeout", "10", "--log-level", "warning", "versioned_app:application")
		cmd.Env = append(os.Environ(), "APP_STARTUP_DELAY="+startupEnv, "APP_VERSION_FILE="+vf)
		cmd.Stderr = logFile(tmp, "gunicorn.log")
		if err := cmd.Start(); err != nil {
			return err
		}
		stop := func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }
		if err := waitHTTP(url, 30*time.Second); err != nil {
			stop()
			return fmt.Errorf("gunicorn alone: %w", err)
		}
		hup := func(n int) error {
			if _, err := versionFile("gunicorn-version", n); err != nil {
				return err
			}
			return cmd.Process.Signal(syscall.SIGHUP)
		}
		rows = append(rows, measure("gunicorn alone", fmt.Sprintf("gunicorn --workers %d (no --preload); version file + SIGHUP", *workers), url, hup))
		stop()
	}
	// The supervisor with gunicorn, then with the Go worker.
	type svCase struct {
		name, reload, command string
		args                  []string
		env                   map[string]string
		version               func(n int) error // puts version n into env
		settle                time.Duration     // readiness.delay: gunicorn's arbiter notifies before forking its workers
	}
	var cases []svCase
	{
		env := map[string]string{"APP_STARTUP_DELAY": startupEnv}
		cases = append(cases, svCase{"supervisor+gunicorn", fmt.Sprintf("%d x gunicorn --preload --workers 1; new version file named in the pool config's env", *workers), "gunicorn",
			[]string{"--preload", "--workers", "1", "--chdir", benchDir, "--graceful-timeout", "10", "--log-level", "warning", "versioned_app:application"},
			env, func(n int) error {
				// A file per version: the running generation keeps its own.
				f, err := versionFile(fmt.Sprintf("sv-gunicorn-version-%d", n), n)
				env["APP_VERSION_FILE"] = f
				return err
			}, 300 * time.Millisecond})
	}
	{
		env := map[string]string{"HELLO_STARTUP_DELAY": startup.String()}
		cases = append(cases, svCase{"supervisor+go", fmt.Sprintf("%d x the Go example worker; version in the pool config's env (GREETING)", *workers), hello, nil,
			env, func(n int) error { env["GREETING"] = fmt.Sprintf("v%d", n); return nil }, 0})
	}
	for i, sc := range cases {
		if !want[sc.name] {
			continue
		}
		pool := fmt.Sprintf("p%d", i)
		port, admin := freePort(), freePort()
		url := fmt.Sprintf("http://127.0.0.1:%d/", port)
		surge := *workers
		win := topo.Duration(*window)
		cfg := &topo.PoolConfig{Version: 1, Command: sc.command, Args: sc.args, Env: sc.env, Workers: *workers, Surge: &surge,
			Stability: topo.Stability{Window: &win},
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
		if err := cmd.Start(); err != nil {
			return err
		}
		stop := func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }
		if err := waitHTTP(url, 60*time.Second); err != nil {
			stop()
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		rows = append(rows, measure(sc.name, sc.reload, url, setCfg))
		stop()
	}

	// Bound directly vs under the supervisor: the same worker, same count.
	var direct []directRow
	if want["direct"] {
		direct = directComparison(tmp, hello, svBin, appDir)
	}

	loadEnd := loadavg()
	gv, _ := exec.Command("gunicorn", "--version").Output()
	conditions := fmt.Sprintf("%d CPUs, load average (1/5/15 min) %s at start, %s at end; %s, %s, %s",
		runtime.NumCPU(), loadStart, loadEnd, runtime.Version(), strings.TrimSpace(string(gv)), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	printTable(rows, direct, conditions)
	if *jsonOut != "" {
		out := struct {
			Command    string         `json:"command"`
			Conditions string         `json:"conditions"`
			Baseline   string         `json:"baseline"`
			Scenarios  []scenario     `json:"scenarios"`
			Direct     []directJSON   `json:"direct"`
			Settings   map[string]any `json:"settings"`
		}{commandLine(), conditions, "gunicorn alone", rows, nil, map[string]any{
			"workers": *workers, "rate": *rate, "startup": startup.String(), "reloads": *reloads, "spacing": spacing.String(),
			"storm": stormFor.String(), "storm_every": stormEvery.String(), "rounds": *rounds, "pin": *pinCPUs}}
		for _, d := range direct {
			out.Direct = append(out.Direct, directJSON{d.name, d.direct, d.underSV, d.ratio, d.cpuDirect, d.cpuSV, d.ratios})
		}
		b, _ := json.MarshalIndent(out, "", "  ")
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

type directJSON struct {
	Name        string    `json:"name"`
	DirectRPS   float64   `json:"direct_rps"`
	UnderSVRPS  float64   `json:"supervisor_rps"`
	Ratio       float64   `json:"ratio"`
	CPUDirectUS float64   `json:"cpu_per_request_direct_us"`
	CPUSVUS     float64   `json:"cpu_per_request_supervisor_us"`
	Ratios      []float64 `json:"round_ratios"`
}

func commandLine() string {
	return strings.TrimSpace("bench/supervisor/run " + strings.Join(os.Args[1:], " "))
}

func loadavg() string { return benchkit.LoadAvg(3) }

func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func waitHTTP(url string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if resp, err := httpClient.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not serving within %s", url, d)
}

func logFile(dir, name string) *os.File {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		panic(err)
	}
	return f
}
