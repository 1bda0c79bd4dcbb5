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
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
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
	sess, err := zksession.Open(zksession.Config{Connect: *zkConnect})
	if err != nil {
		return err
	}
	defer sess.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sess.WaitConnected(ctx); err != nil {
		return fmt.Errorf("ZooKeeper at %s (scripts/devenv up): %w", *zkConnect, err)
	}
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

type change struct {
	at  time.Duration // since the load started, taken just before the change
	ver int
}

// measure runs steady state, spaced reloads and the storm against url.
// apply(n) makes change n: afterwards new code answers with version n.
func measure(name, how, url string, apply func(n int) error) scenario {
	waitTimeWait()
	sc := scenario{Name: name, Reload: how, LoadBefore: loadavg()}
	fmt.Printf("== %s (%s); load average %s\n", name, how, sc.LoadBefore)
	steady := load(url, func(time.Time, *loader) { time.Sleep(*steadyFor) })
	for _, s := range steady {
		if s.ok() {
			sc.SteadyRPS++
		}
	}
	sc.SteadyRPS /= steadyFor.Seconds()
	fmt.Printf("   steady: %.0f req/s\n", sc.SteadyRPS)

	n := 0
	var changes []change
	rec := load(url, func(start time.Time, _ *loader) {
		time.Sleep(500 * time.Millisecond)
		for i := 0; i < *reloads; i++ {
			n++
			at := time.Now()
			changes = append(changes, change{at.Sub(start), n})
			if err := apply(n); err != nil {
				fmt.Fprintln(os.Stderr, "reload:", err)
			}
			time.Sleep(time.Until(at.Add(*spacing)))
		}
	})
	sc.Reloads = summarize(rec)
	var firsts, alls []time.Duration
	for i, c := range changes {
		end := time.Duration(math.MaxInt64)
		if i+1 < len(changes) {
			end = changes[i+1].at
		}
		first, all, okFirst, okAll := toNew(rec, c.at, end, c.ver)
		if okFirst {
			firsts = append(firsts, first)
		}
		if okAll {
			alls = append(alls, all)
		}
	}
	sc.Reloads.Changes, sc.Reloads.FirstSeen, sc.Reloads.AllNew = len(changes), len(firsts), len(alls)
	sc.Reloads.FirstP50MS, sc.Reloads.FirstMaxMS = p50max(firsts)
	sc.Reloads.AllP50MS, sc.Reloads.AllMaxMS = p50max(alls)
	fmt.Printf("   reloads: %d sent, %d non-2xx, %d errors, slowest %.0fms; new code first answers after %.0f/%.0fms (p50/max), answers alone after %.0f/%.0fms; %d/%d changes served alone before the next\n",
		sc.Reloads.Sent, sc.Reloads.Non2xx, sc.Reloads.ConnErr, sc.Reloads.MaxMS, sc.Reloads.FirstP50MS, sc.Reloads.FirstMaxMS,
		sc.Reloads.AllP50MS, sc.Reloads.AllMaxMS, sc.Reloads.AllNew, sc.Reloads.Changes)

	var last change
	firstStorm := n + 1
	var stormStart, stormEnd time.Duration
	rec = load(url, func(start time.Time, l *loader) {
		time.Sleep(500 * time.Millisecond)
		stormStart = time.Since(start)
		stop := time.Now().Add(*stormFor)
		for time.Now().Before(stop) {
			n++
			at := time.Now()
			last = change{at.Sub(start), n}
			if err := apply(n); err != nil {
				fmt.Fprintln(os.Stderr, "reload:", err)
			}
			time.Sleep(time.Until(at.Add(*stormEvery)))
		}
		stormEnd = time.Since(start)
		// Keep the load on until the newest version alone has answered
		// for a second (or 30 s): new code is seen only in answers.
		for time.Since(start.Add(last.at)) < 30*time.Second {
			_, all, _, ok := toNew(l.snapshot(), last.at, math.MaxInt64, last.ver)
			if ok && time.Since(start.Add(last.at+all)) > time.Second {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	s := summarize(rec)
	versions := map[int]bool{}
	for _, r := range rec {
		if d := r.done(); r.ok() && d >= stormStart && d < stormEnd {
			s.RPS++
		}
		if r.ok() && r.ver >= firstStorm {
			versions[r.ver] = true
		}
	}
	s.RPS /= (stormEnd - stormStart).Seconds()
	s.VersionsServed = len(versions)
	first, all, okFirst, okAll := toNew(rec, last.at, math.MaxInt64, last.ver)
	s.Changes = n - firstStorm + 1
	if okFirst {
		s.FirstSeen, s.FirstP50MS, s.FirstMaxMS = 1, ms(first), ms(first)
	}
	if okAll {
		s.AllNew, s.AllP50MS, s.AllMaxMS = 1, ms(all), ms(all)
	}
	sc.Storm = s
	sc.LoadAfter = loadavg()
	fmt.Printf("   storm: %d changes, %d sent, %d non-2xx, %d errors, slowest %.0fms, %.0f req/s during the storm, %d versions answered; newest code first answers %.0fms after the last change, alone after %.0fms; load average %s\n",
		s.Changes, s.Sent, s.Non2xx, s.ConnErr, s.MaxMS, s.RPS, s.VersionsServed, s.FirstP50MS, s.AllP50MS, sc.LoadAfter)
	return sc
}

// toNew finds, among the answers completed in [from, to), the first one
// carrying version ver or newer, and the first such answer after which no
// answer carries an older version (or none: error pages have no version),
// as times since from. Connection errors are not answers and do not count.
func toNew(rec []sample, from, to time.Duration, ver int) (first, all time.Duration, okFirst, okAll bool) {
	lastOld := time.Duration(-1)
	for _, s := range rec {
		if d := s.done(); d >= from && d < to && s.code != 0 && s.ver < ver && d > lastOld {
			lastOld = d
		}
	}
	first, all = math.MaxInt64, math.MaxInt64
	for _, s := range rec {
		d := s.done()
		if d < from || d >= to || !s.ok() || s.ver < ver {
			continue
		}
		first = min(first, d)
		if d > lastOld {
			all = min(all, d)
		}
	}
	okFirst, okAll = first != math.MaxInt64, all != math.MaxInt64
	return first - from, all - from, okFirst, okAll
}

func p50max(v []time.Duration) (float64, float64) {
	if len(v) == 0 {
		return 0, 0
	}
	slices.Sort(v)
	return ms(v[len(v)/2]), ms(v[len(v)-1])
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

type sample struct {
	at   time.Duration // when it was due, since the load started
	lat  time.Duration
	code int // 0: connection error
	ver  int // the code version that answered; -1: none
}

func (s sample) done() time.Duration { return s.at + s.lat }
func (s sample) ok() bool            { return s.code >= 200 && s.code < 300 }

// Keep-alive, as a load balancer would: Go's worker closes idle
// connections when it drains (the client retries a GET whose reused
// connection was closed before any answer, as HTTP allows), and gunicorn's
// sync workers close after every response anyway.
var httpClient = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

// waitTimeWait lets TIME_WAIT sockets left by the previous scenario drain
// (up to a minute): tens of thousands of them make connect() slow on
// loopback and would be charged to the next scenario.
func waitTimeWait() {
	for deadline := time.Now().Add(70 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		b, err := os.ReadFile("/proc/net/sockstat")
		if err != nil {
			return
		}
		m := regexp.MustCompile(`tw (\d+)`).FindSubmatch(b)
		if m == nil {
			return
		}
		if n, _ := strconv.Atoi(string(m[1])); n < 5000 {
			return
		}
	}
}

type loader struct {
	mu      sync.Mutex
	samples []sample
}

// snapshot is what has completed so far.
func (l *loader) snapshot() []sample {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.samples)
}

// version reads versioned_app.py's X-App-Version header, or the Go
// worker's greeting ("vN from pid ...").
var goVersion = regexp.MustCompile(`^v(\d+) `)

func version(h http.Header, body []byte) int {
	if v, err := strconv.Atoi(h.Get("X-App-Version")); err == nil {
		return v
	}
	if m := goVersion.FindSubmatch(body); m != nil {
		v, _ := strconv.Atoi(string(m[1]))
		return v
	}
	return -1
}

// load offers a constant rate of requests until driver returns (open loop:
// a slow server does not slow the offered load, and latency is measured
// from the moment a request was due, so queueing behind a stall counts),
// then waits for the requests in flight.
func load(url string, driver func(start time.Time, l *loader)) []sample {
	start := time.Now()
	l := &loader{}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	sem := make(chan struct{}, 1024)
	interval := time.Duration(float64(time.Second) / float64(*rate))
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			due := start.Add(time.Duration(i) * interval)
			time.Sleep(time.Until(due))
			select { // stop first: the select below picks at random
			case <-stop:
				return
			default:
			}
			select {
			case <-stop:
				return
			case sem <- struct{}{}:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				code, ver := 0, -1
				resp, err := httpClient.Get(url)
				if err == nil {
					var body []byte
					body, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil {
						code, ver = resp.StatusCode, version(resp.Header, body)
					}
				}
				s := sample{at: due.Sub(start), lat: time.Since(due), code: code, ver: ver}
				l.mu.Lock()
				l.samples = append(l.samples, s)
				l.mu.Unlock()
			}()
		}
	}()
	driver(start, l)
	close(stop)
	wg.Wait()
	return l.samples
}

func summarize(rec []sample) phase {
	p := phase{Sent: len(rec)}
	for _, s := range rec {
		switch {
		case s.code == 0:
			p.ConnErr++
		case !s.ok():
			p.Non2xx++
		}
	}
	p.Failed = p.Non2xx + p.ConnErr
	lat := make([]time.Duration, 0, len(rec))
	for _, s := range rec {
		lat = append(lat, s.lat)
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		p.P50MS, p.P99MS, p.MaxMS = ms(lat[len(lat)/2]), ms(lat[len(lat)*99/100]), ms(lat[len(lat)-1])
	}
	return p
}

type directRow struct {
	name             string
	direct, underSV  float64 // medians, req/s
	ratio            float64 // median of the rounds' supervisor/direct ratios
	cpuDirect, cpuSV float64 // medians: server process tree CPU per request, µs
	ratios           []float64
	directP99, svP99 string
}

// directComparison measures steady throughput with wrk: gunicorn bound
// directly vs gunicorn under the supervisor, and the Go worker bound
// directly vs under the supervisor (one process each, so the port needs
// no sharing).
func directComparison(tmp, hello, svBin, appDir string) []directRow {
	fmt.Println("== bound directly vs under the supervisor (wrk)")
	var rows []directRow
	runWrk := func(url string, hdr ...string) (float64, string, float64) {
		args := append([]string{"-t", "2", "-c", strconv.Itoa(*conc), "-d", "3s", "--latency"}, hdr...)
		out, err := pin(exec.Command("wrk", append(args, url)...), wrkCPUs()).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "wrk: %v\n%s", err, out)
			return 0, "?", 0
		}
		m := regexp.MustCompile(`Requests/sec:\s+([\d.]+)`).FindSubmatch(out)
		p := regexp.MustCompile(`99%\s+(\S+)`).FindSubmatch(out)
		n := regexp.MustCompile(`(\d+) requests in`).FindSubmatch(out)
		if m == nil || n == nil {
			return 0, "?", 0
		}
		rps, _ := strconv.ParseFloat(string(m[1]), 64)
		reqs, _ := strconv.ParseFloat(string(n[1]), 64)
		p99 := "?"
		if p != nil {
			p99 = string(p[1])
		}
		return rps, p99, reqs
	}
	// cpuPerReq runs one wrk round against url and returns, besides its
	// figures, the CPU time the server's whole process tree (root and
	// every descendant: supervisor, arbiters, workers) spent per request.
	// On a saturated 2-core machine shared with wrk, throughput swings by
	// 10-20% from round to round; the CPU cost of a request barely moves,
	// and it is what the supervisor could add.
	cpuPerReq := func(root int, url string, hdr ...string) (rps float64, p99 string, usPerReq float64) {
		c0 := treeCPU(root)
		rps, p99, reqs := runWrk(url, hdr...)
		if reqs > 0 {
			usPerReq = float64((treeCPU(root) - c0).Microseconds()) / reqs
		}
		return rps, p99, usPerReq
	}
	startProc := func(cmd *exec.Cmd, url string) (func(), error) {
		cmd.Stderr = logFile(tmp, "direct.log")
		pin(cmd, serverCPUs())
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		stop := func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }
		if err := waitHTTP(url, 60*time.Second); err != nil {
			stop()
			return nil, err
		}
		return stop, nil
	}
	// Both run side by side (an idle server costs nothing); wrk alternates
	// between them for -rounds rounds and the median counts, so drift of the
	// machine (TIME_WAIT build-up, other load) hits both alike.
	compare := func(name string, direct, sv *exec.Cmd, durl, surl string, hdr ...string) {
		waitTimeWait()
		stopD, err := startProc(direct, durl)
		if err != nil {
			fmt.Fprintln(os.Stderr, name, "direct:", err)
			return
		}
		defer stopD()
		stopS, err := startProc(sv, surl)
		if err != nil {
			fmt.Fprintln(os.Stderr, name, "supervisor:", err)
			return
		}
		defer stopS()
		// Paired rounds: each round measures both sides back to back, in
		// alternating order (so that neither always runs on the TIME_WAIT
		// sockets the other left, or first after a pause), and the median
		// of the rounds' ratios is the figure.
		var ds, ss, ratios, dc, sc []float64
		var dp, sp string
		droot, sroot := direct.Process.Pid, sv.Process.Pid
		for i := 0; i < *rounds; i++ {
			var dr, sr, dcpu, scpu float64
			if i%2 == 0 {
				dr, dp, dcpu = cpuPerReq(droot, durl, hdr...)
				sr, sp, scpu = cpuPerReq(sroot, surl, hdr...)
			} else {
				sr, sp, scpu = cpuPerReq(sroot, surl, hdr...)
				dr, dp, dcpu = cpuPerReq(droot, durl, hdr...)
			}
			ds, ss, dc, sc = append(ds, dr), append(ss, sr), append(dc, dcpu), append(sc, scpu)
			if dr > 0 {
				ratios = append(ratios, sr/dr)
			}
		}
		med := func(v []float64) float64 {
			if len(v) == 0 {
				return 0
			}
			v = slices.Clone(v)
			sort.Float64s(v)
			return v[len(v)/2]
		}
		row := directRow{name: name, direct: med(ds), underSV: med(ss), ratio: med(ratios), ratios: ratios, directP99: dp, svP99: sp,
			cpuDirect: med(dc), cpuSV: med(sc)}
		rows = append(rows, row)
		fmt.Printf("   %s: direct %.0f, supervisor %.0f req/s (medians of %d rounds); per-round ratios %s -> median %.1f%%; server CPU per request %.1f vs %.1f us (%.3fx)\n",
			name, row.direct, row.underSV, *rounds, fmtRatios(ratios), 100*row.ratio, row.cpuDirect, row.cpuSV, row.cpuSV/max(row.cpuDirect, 1e-9))
	}
	env := func(kv ...string) []string { return append(os.Environ(), kv...) }
	svCmd := func(name string, cfg topo.PoolConfig) *exec.Cmd {
		file := filepath.Join(tmp, name+".json")
		b, _ := topo.EncodePoolConfig(&cfg)
		_ = os.WriteFile(file, b, 0o644)
		return exec.Command(svBin, "--config", file, "--admin", "", "--pool", name, "--state-dir", filepath.Join(tmp, name), "--log-level", "warn")
	}
	{
		dport, sport := freePort(), freePort()
		d := exec.Command("gunicorn", "--preload", "--workers", strconv.Itoa(*workers), "--bind", fmt.Sprintf("127.0.0.1:%d", dport), "--chdir", appDir, "--log-level", "warning", "wsgi_app:application")
		d.Env = env("APP_STARTUP_DELAY=0")
		sv := svCmd("direct-gunicorn", topo.PoolConfig{Version: 1, Command: "gunicorn", Workers: *workers, Env: map[string]string{"APP_STARTUP_DELAY": "0"},
			Args:   []string{"--preload", "--workers", "1", "--chdir", appDir, "--log-level", "warning", "wsgi_app:application"},
			Listen: []topo.Listen{{Name: "http", Addr: fmt.Sprintf("tcp://127.0.0.1:%d", sport)}}})
		// gunicorn's sync workers close every connection: tell wrk so.
		compare(fmt.Sprintf("gunicorn, %d workers", *workers), d, sv, fmt.Sprintf("http://127.0.0.1:%d/", dport), fmt.Sprintf("http://127.0.0.1:%d/", sport), "-H", "Connection: close")
	}
	{
		dport, sport := freePort(), freePort()
		d := exec.Command(hello)
		d.Env = env(fmt.Sprintf("HELLO_ADDR=127.0.0.1:%d", dport))
		sv := svCmd("direct-go", topo.PoolConfig{Version: 1, Command: hello, Workers: 1,
			Listen: []topo.Listen{{Name: "http", Addr: fmt.Sprintf("tcp://127.0.0.1:%d", sport)}}})
		compare("go worker, 1 process", d, sv, fmt.Sprintf("http://127.0.0.1:%d/", dport), fmt.Sprintf("http://127.0.0.1:%d/", sport))
	}
	return rows
}

// serverCPUs and wrkCPUs split the machine for the direct comparison
// (empty: no pinning).
func serverCPUs() string {
	if !*pinCPUs {
		return ""
	}
	return "0"
}

func wrkCPUs() string {
	if !*pinCPUs {
		return ""
	}
	return fmt.Sprintf("1-%d", runtime.NumCPU()-1)
}

// pin makes c (not started yet) run under taskset on cpus, and returns
// it; the program keeps the same pid (taskset execs it), so its process
// tree is measured as before.
func pin(c *exec.Cmd, cpus string) *exec.Cmd {
	if cpus == "" {
		return c
	}
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		c.Err = err
		return c
	}
	c.Args = append([]string{"taskset", "-c", cpus, c.Path}, c.Args[1:]...)
	c.Path = taskset
	return c
}

// treeCPU is the user+system CPU time of pid and all its descendants.
func treeCPU(root int) time.Duration {
	ents, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	ticks := map[int]int64{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The command name is in parentheses and may hold spaces.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		parent[pid], ticks[pid] = ppid, ut+st
	}
	in := func(pid int) bool {
		for p := pid; p > 1; p = parent[p] {
			if p == root {
				return true
			}
		}
		return false
	}
	var total int64
	for pid, t := range ticks {
		if in(pid) {
			total += t
		}
	}
	return time.Duration(total) * time.Second / 100 // USER_HZ is 100 on Linux
}

func fmtRatios(v []float64) string {
	var parts []string
	for _, r := range v {
		parts = append(parts, fmt.Sprintf("%.2f", r))
	}
	return strings.Join(parts, " ")
}

// printTable prints the reload figures as a markdown table (the docs paste
// it verbatim) with every supervisor column's ratio against gunicorn alone
// from the same run, then the direct comparison and the targets.
func printTable(rows []scenario, direct []directRow, conditions string) {
	fmt.Println()
	fmt.Println("command:", commandLine())
	fmt.Println("machine:", conditions)
	fmt.Printf("load: %d req/s constant, %d workers, app import %s; %d reloads %s apart; storm: a change every %s for %s\n",
		*rate, *workers, *startup, *reloads, *spacing, *stormEvery, *stormFor)
	fmt.Printf("supervisor: stability.window %s (gunicorn alone has none), one keeper process per worker\n", *window)
	for _, r := range rows {
		fmt.Printf("%s: %s\n", r.Name, r.Reload)
	}
	if len(rows) > 0 {
		type metric struct {
			label string
			get   func(s *scenario) (v float64, text string, ok bool)
			ratio bool
		}
		msv := func(f func(s *scenario) (float64, bool)) func(s *scenario) (float64, string, bool) {
			return func(s *scenario) (float64, string, bool) {
				v, ok := f(s)
				if !ok {
					return 0, "never", false
				}
				if v < 10 {
					return v, fmt.Sprintf("%.1f ms", v), true
				}
				return v, fmt.Sprintf("%.0f ms", v), true
			}
		}
		count := func(f func(s *scenario) int) func(s *scenario) (float64, string, bool) {
			return func(s *scenario) (float64, string, bool) { v := f(s); return float64(v), strconv.Itoa(v), true }
		}
		rps := func(f func(s *scenario) float64) func(s *scenario) (float64, string, bool) {
			return func(s *scenario) (float64, string, bool) {
				v := f(s)
				if v < 10 {
					return v, fmt.Sprintf("%.1f req/s", v), true
				}
				return v, fmt.Sprintf("%.0f req/s", v), true
			}
		}
		frac := func(f func(s *scenario) (int, int)) func(s *scenario) (float64, string, bool) {
			return func(s *scenario) (float64, string, bool) { a, b := f(s); return 0, fmt.Sprintf("%d/%d", a, b), true }
		}
		metrics := []metric{
			{"steady throughput (same generator)", rps(func(s *scenario) float64 { return s.SteadyRPS }), true},
			{"reloads: failed requests", count(func(s *scenario) int { return s.Reloads.Failed }), true},
			{"reloads: slowest request", msv(func(s *scenario) (float64, bool) { return s.Reloads.MaxMS, true }), true},
			{"reloads: p99 latency", msv(func(s *scenario) (float64, bool) { return s.Reloads.P99MS, true }), true},
			{"reloads: change -> first answer from new code, p50", msv(func(s *scenario) (float64, bool) { return s.Reloads.FirstP50MS, s.Reloads.FirstSeen > 0 }), true},
			{"reloads: change -> first answer from new code, max", msv(func(s *scenario) (float64, bool) { return s.Reloads.FirstMaxMS, s.Reloads.FirstSeen > 0 }), true},
			{"reloads: change -> all answers from new code, p50", msv(func(s *scenario) (float64, bool) { return s.Reloads.AllP50MS, s.Reloads.AllNew > 0 }), true},
			{"reloads: change -> all answers from new code, max", msv(func(s *scenario) (float64, bool) { return s.Reloads.AllMaxMS, s.Reloads.AllNew > 0 }), true},
			{"reloads: changes served alone before the next", frac(func(s *scenario) (int, int) { return s.Reloads.AllNew, s.Reloads.Changes }), false},
			{"storm: failed requests", count(func(s *scenario) int { return s.Storm.Failed }), true},
			{"storm: slowest request", msv(func(s *scenario) (float64, bool) { return s.Storm.MaxMS, true }), true},
			{"storm: throughput while changes are made", rps(func(s *scenario) float64 { return s.Storm.RPS }), true},
			{"storm: versions that answered", frac(func(s *scenario) (int, int) { return s.Storm.VersionsServed, s.Storm.Changes }), false},
			{"storm: last change -> first answer from its code", msv(func(s *scenario) (float64, bool) { return s.Storm.FirstP50MS, s.Storm.FirstSeen > 0 }), true},
			{"storm: last change -> all answers from its code", msv(func(s *scenario) (float64, bool) { return s.Storm.AllP50MS, s.Storm.AllNew > 0 }), true},
		}
		var base *scenario
		for i := range rows {
			if rows[i].Name == "gunicorn alone" {
				base = &rows[i]
			}
		}
		header := []string{"metric"}
		for _, r := range rows {
			if r.Name == "gunicorn alone" {
				header = append(header, "gunicorn alone (baseline)")
				continue
			}
			header = append(header, r.Name, "ratio")
		}
		table := [][]string{header}
		for _, m := range metrics {
			line := []string{m.label}
			for i := range rows {
				v, text, ok := m.get(&rows[i])
				line = append(line, text)
				if rows[i].Name == "gunicorn alone" {
					continue
				}
				ratio := "-"
				if base != nil && m.ratio && ok {
					if b, _, bok := m.get(base); bok && b != 0 {
						ratio = fmt.Sprintf("%.2fx", v/b)
					}
				}
				line = append(line, ratio)
			}
			table = append(table, line)
		}
		fmt.Println()
		printMarkdown(table)
	}

	if len(direct) > 0 {
		fmt.Println()
		fmt.Printf("%-26s %14s %14s %8s   %-26s %s\n", "steady throughput (wrk)", "direct req/s", "supervisor", "ratio", "p99 direct / supervisor", "server CPU/request direct / supervisor")
		for _, d := range direct {
			fmt.Printf("%-26s %14.0f %14.0f %7.1f%%   %-26s %.1f / %.1f us (%.3fx)\n", d.name, d.direct, d.underSV, 100*d.ratio, d.directP99+" / "+d.svP99,
				d.cpuDirect, d.cpuSV, d.cpuSV/max(d.cpuDirect, 1e-9))
		}
	}
	fmt.Println()
	fmt.Println("targets (supervisor columns): zero failed requests across swaps and the storm; slowest request <= 100ms;")
	fmt.Println("storm throughput >= 90% of steady; every change's code serving alone before the next; steady throughput within 5% of the same worker bound directly.")
	for _, r := range rows {
		if !strings.HasPrefix(r.Name, "supervisor") {
			continue
		}
		var fails []string
		if f := r.Reloads.Failed + r.Storm.Failed; f > 0 {
			fails = append(fails, fmt.Sprintf("%d failed requests", f))
		}
		if m := max(r.Reloads.MaxMS, r.Storm.MaxMS); m > 100 {
			fails = append(fails, fmt.Sprintf("slowest %.0fms > 100ms", m))
		}
		if r.Storm.RPS < 0.9*r.SteadyRPS {
			fails = append(fails, fmt.Sprintf("storm throughput %.0f%% of steady < 90%%", 100*r.Storm.RPS/r.SteadyRPS))
		}
		if r.Reloads.AllNew < r.Reloads.Changes || r.Storm.AllNew == 0 {
			fails = append(fails, fmt.Sprintf("new code alone after %d/%d reloads, storm %d/1", r.Reloads.AllNew, r.Reloads.Changes, r.Storm.AllNew))
		}
		verdict := "MET"
		if len(fails) > 0 {
			verdict = "MISSED: " + strings.Join(fails, "; ")
		}
		fmt.Printf("  %-32s %s\n", r.Name, verdict)
	}
	for _, d := range direct {
		verdict := "MET"
		if d.ratio < 0.95 {
			verdict = "MISSED"
		}
		fmt.Printf("  %-32s %s (%.1f%%, median of %d paired rounds)\n", d.name+" throughput", verdict, 100*d.ratio, len(d.ratios))
		verdict = "MET"
		if d.cpuDirect == 0 || d.cpuSV > 1.05*d.cpuDirect {
			verdict = "MISSED"
		}
		fmt.Printf("  %-32s %s (%.3fx the CPU per request of the same worker bound directly)\n", d.name+" CPU cost", verdict, d.cpuSV/max(d.cpuDirect, 1e-9))
	}
}

// printMarkdown prints rows as a padded markdown table; the first row is
// the header, the first column left-aligned, the others right-aligned.
func printMarkdown(rows [][]string) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len(c), 3)
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			if i == 0 {
				fmt.Fprintf(&b, "| %-*s ", width[i], c)
			} else {
				fmt.Fprintf(&b, "| %*s ", width[i], c)
			}
		}
		fmt.Println(b.String() + "|")
	}
	line(rows[0])
	sep := make([]string, len(width))
	for i, w := range width {
		if i == 0 {
			sep[i] = strings.Repeat("-", w)
		} else {
			sep[i] = strings.Repeat("-", w-1) + ":"
		}
	}
	line(sep)
	for _, r := range rows[1:] {
		line(r)
	}
}
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
