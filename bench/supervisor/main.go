// Command supervisor-bench compares reloads under load: gunicorn alone
// (reloaded with SIGHUP) against shardvisor's supervisor running gunicorn
// or the Go example worker (reloaded by a ZooKeeper config change), with an
// app that takes STARTUP (1.5 s) to import. Run it with
// `make bench-supervisor` or bench/supervisor/run; it needs the local
// ZooKeeper (scripts/devenv up) and gunicorn, wrk (scripts/install-deps).
//
// Two load generators: Debian's wrk measures steady-state throughput (the
// "bound directly vs under the supervisor" comparison, where the load
// generator's own efficiency matters); during reloads and storms an
// open-loop generator in this program offers a constant rate and records
// every request (when it was due, latency, status or connection error),
// because per-request timelines are needed to attribute errors and
// throughput to the reload windows, which neither wrk nor hey report.
// Latency counts from the moment a request was due, so a stall is charged
// in full (no coordinated omission).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
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
	conc       = flag.Int("c", 8, "connections of wrk (steady-state throughput)")
	rate       = flag.Int("rate", 200, "constant offered load during reloads and storms, requests/s")
	steadyFor  = flag.Duration("steady", 5*time.Second, "steady-state measurement time")
	zkConnect  = flag.String("zk", cliutil.LocalZK, "ZooKeeper connect string")
	repo       = flag.String("repo", ".", "repository root")
	only       = flag.String("only", "gunicorn,supervisor+gunicorn,supervisor+go,direct", "scenarios to run, comma-separated: gunicorn (alone), supervisor+gunicorn, supervisor+go, direct (steady throughput bound directly vs under the supervisor)")
	pinCPUs    = flag.Bool("pin", runtime.NumCPU() >= 2, "in the direct comparison, pin the servers to the first CPU and wrk to the others (taskset), so that the load generator and the servers do not trade cores from round to round")
	rounds     = flag.Int("rounds", 15, "paired wrk rounds in the direct comparison (order alternating; the median of the rounds' ratios counts)")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type result struct {
	name                  string
	sent, non2xx, connErr int
	p50, p99, max         time.Duration
	rps, steadyRPS        float64 // during the windows, and steady (same generator)
	swapP50, swapMax      time.Duration
	swapsDone, swapsTotal int
	converge              time.Duration // storm: last change -> newest config serving
	wrkRPS                float64
	note                  string
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
	startupEnv := strconv.FormatFloat(startup.Seconds(), 'f', 3, 64)

	fmt.Printf("supervisor benchmark: %d workers, constant load %d req/s (keep-alive; gunicorn closes after each response), start-up %s, %d reloads every %s, storm: a change every %s for %s\n\n",
		*workers, *rate, *startup, *reloads, *spacing, *stormEvery, *stormFor)
	var rows []result

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

	// gunicorn alone.
	if want["gunicorn"] {
		port := freePort()
		url := fmt.Sprintf("http://127.0.0.1:%d/", port)
		cmd := exec.Command("gunicorn", "--preload", "--workers", strconv.Itoa(*workers), "--bind", fmt.Sprintf("127.0.0.1:%d", port),
			"--chdir", appDir, "--graceful-timeout", "10", "--log-level", "warning", "wsgi_app:application")
		cmd.Env = append(os.Environ(), "APP_STARTUP_DELAY="+startupEnv)
		cmd.Stderr = logFile(tmp, "gunicorn.log")
		if err := cmd.Start(); err != nil {
			return err
		}
		stop := func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }
		if err := waitHTTP(url, 30*time.Second); err != nil {
			stop()
			return fmt.Errorf("gunicorn alone: %w", err)
		}
		hup := func(int) (func() bool, error) { return nil, cmd.Process.Signal(syscall.SIGHUP) }
		r, s := measure("gunicorn alone", url, hup)
		rows = append(rows, r, s)
		stop()
	}
	// The supervisor with gunicorn, then with the Go worker.
	type svCase struct {
		name, command string
		args          []string
		env           map[string]string
		settle        time.Duration // readiness.delay: gunicorn's arbiter notifies before forking its workers
	}
	cases := []svCase{
		{"supervisor+gunicorn", "gunicorn", []string{"--preload", "--workers", "1", "--chdir", appDir, "--graceful-timeout", "10", "--log-level", "warning", "wsgi_app:application"},
			map[string]string{"APP_STARTUP_DELAY": startupEnv}, 300 * time.Millisecond},
		{"supervisor+go", hello, nil, map[string]string{"HELLO_STARTUP_DELAY": startup.String()}, 0},
	}
	for i, sc := range cases {
		if !want[sc.name] {
			continue
		}
		pool := fmt.Sprintf("p%d", i)
		port, admin := freePort(), freePort()
		url := fmt.Sprintf("http://127.0.0.1:%d/", port)
		surge := *workers
		cfg := &topo.PoolConfig{Version: 1, Command: sc.command, Args: sc.args, Env: sc.env, Workers: *workers, Surge: &surge,
			Listen: []topo.Listen{{Name: "http", Addr: fmt.Sprintf("tcp://127.0.0.1:%d", port)}}, GracefulTimeout: topo.Duration(15 * time.Second),
			Readiness: topo.Readiness{Timeout: topo.Duration(30 * time.Second), Delay: topo.Duration(sc.settle)}}
		setCfg := func(n int) (int32, error) {
			cfg.Env["RELOAD"] = strconv.Itoa(n)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			v, _, err := topo.SetPoolConfig(ctx, sess, paths, pool, cfg, -1)
			return v, err
		}
		if _, err := setCfg(0); err != nil {
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
		adminURL := fmt.Sprintf("http://127.0.0.1:%d/status", admin)
		change := func(n int) (func() bool, error) {
			v, err := setCfg(n)
			if err != nil {
				return nil, err
			}
			return func() bool { return servingConfig(adminURL, int64(v), *workers) }, nil
		}
		r, s := measure(sc.name, url, change)
		rows = append(rows, r, s)
		stop()
	}

	// Bound directly vs under the supervisor: the same worker, same count.
	var direct []directRow
	if want["direct"] {
		direct = directComparison(tmp, hello, svBin, appDir)
	}

	printTable(rows, direct)
	return nil
}

// measure runs steady state, reloads and the storm against url.
// reload(n) makes change n and returns a probe that reports the change
// fully applied (nil when it cannot be observed, as with gunicorn).
func measure(name, url string, reload func(n int) (func() bool, error)) (result, result) {
	waitTimeWait()
	fmt.Printf("== %s\n", name)
	steady := load(url, *steadyFor, nil)
	steadyRPS := float64(len(steady.ok)) / steadyFor.Seconds()
	fmt.Printf("   steady: %.0f req/s\n", steadyRPS)

	n := 0
	var swaps []time.Duration
	done := 0
	total := time.Duration(*reloads)*(*spacing) + time.Second
	var marks []time.Duration
	rec := load(url, total, func(start time.Time) {
		time.Sleep(500 * time.Millisecond)
		for i := 0; i < *reloads; i++ {
			at := time.Now()
			marks = append(marks, at.Sub(start))
			n++
			probe, err := reload(n)
			if err != nil {
				fmt.Fprintln(os.Stderr, "reload:", err)
			}
			next := at.Add(*spacing)
			for probe != nil && time.Now().Before(next) {
				if probe() {
					swaps = append(swaps, time.Since(at))
					done++
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(time.Until(next))
		}
	})
	r := summarize(name+": reloads", rec, steadyRPS, marks, *startup+500*time.Millisecond)
	r.swapsTotal, r.swapsDone = *reloads, done
	if len(swaps) > 0 {
		sort.Slice(swaps, func(i, j int) bool { return swaps[i] < swaps[j] })
		r.swapP50, r.swapMax = swaps[len(swaps)/2], swaps[len(swaps)-1]
	}
	fmt.Printf("   reloads: %d sent, %d non-2xx, %d errors, max %s\n", r.sent, r.non2xx, r.connErr, r.max.Round(time.Millisecond))

	var lastProbe func() bool
	var converge time.Duration
	converged := false
	rec = load(url, *stormFor+4*time.Second, func(start time.Time) {
		time.Sleep(500 * time.Millisecond)
		end := time.Now().Add(*stormFor)
		var last time.Time
		for time.Now().Before(end) {
			n++
			last = time.Now()
			lastProbe, _ = reload(n)
			time.Sleep(*stormEvery)
		}
		// Convergence on the newest config, measured from the last change.
		for lastProbe != nil && time.Since(last) < 60*time.Second {
			if lastProbe() {
				converge, converged = time.Since(last), true
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	s := summarize(name+": storm", rec, steadyRPS, []time.Duration{500 * time.Millisecond}, *stormFor)
	s.converge = converge
	if lastProbe != nil {
		if converged {
			s.note = "converged on the newest config"
		} else {
			s.note = "DID NOT converge on the newest config"
		}
	}
	fmt.Printf("   storm: %d sent, %d non-2xx, %d errors, throughput %.0f%% of steady\n", s.sent, s.non2xx, s.connErr, 100*s.rps/s.steadyRPS)
	return r, s
}

type sample struct {
	at   time.Duration // since the load started
	lat  time.Duration
	code int // 0: connection error
}

type recording struct {
	ok, bad []sample
}

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

// load offers a constant rate of requests for d (open loop: a slow server
// does not slow the offered load, and latency is measured from the moment
// a request was due, so queueing behind a stall counts) while driver (if
// any) runs.
func load(url string, d time.Duration, driver func(start time.Time)) recording {
	start := time.Now()
	var mu sync.Mutex
	var rec recording
	var wg sync.WaitGroup
	sem := make(chan struct{}, 1024)
	interval := time.Duration(float64(time.Second) / float64(*rate))
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			due := start.Add(time.Duration(i) * interval)
			if due.Sub(start) >= d {
				return
			}
			time.Sleep(time.Until(due))
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				code := 0
				resp, err := httpClient.Get(url)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil {
						code = resp.StatusCode
					}
				}
				s := sample{at: due.Sub(start), lat: time.Since(due), code: code}
				mu.Lock()
				if code >= 200 && code < 300 {
					rec.ok = append(rec.ok, s)
				} else {
					rec.bad = append(rec.bad, s)
				}
				mu.Unlock()
			}()
		}
	}()
	if driver != nil {
		driver(start)
	}
	wg.Wait()
	return rec
}

// summarize computes the statistics; rps counts successful requests that
// completed inside the windows [mark, mark+win).
func summarize(name string, rec recording, steadyRPS float64, marks []time.Duration, win time.Duration) result {
	r := result{name: name, steadyRPS: steadyRPS, sent: len(rec.ok) + len(rec.bad)}
	for _, b := range rec.bad {
		if b.code == 0 {
			r.connErr++
		} else {
			r.non2xx++
		}
	}
	all := append(append([]sample(nil), rec.ok...), rec.bad...)
	sort.Slice(all, func(i, j int) bool { return all[i].lat < all[j].lat })
	if len(all) > 0 {
		r.p50, r.p99, r.max = all[len(all)/2].lat, all[len(all)*99/100].lat, all[len(all)-1].lat
	}
	in := 0
	for _, s := range rec.ok {
		done := s.at + s.lat // completions, not starts, make throughput
		for _, m := range marks {
			if done >= m && done < m+win {
				in++
				break
			}
		}
	}
	r.rps = float64(in) / (win.Seconds() * float64(len(marks)))
	return r
}

func servingConfig(statusURL string, version int64, n int) bool {
	resp, err := httpClient.Get(statusURL)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var body struct{ Member topo.PoolMember }
	if json.NewDecoder(resp.Body).Decode(&body) != nil {
		return false
	}
	m := body.Member
	if m.State != "serving" || m.ConfigVersion != version || len(m.Workers) != n {
		return false
	}
	for _, w := range m.Workers {
		if w.State != "ready" || w.Generation != m.Generation {
			return false
		}
	}
	return true
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

func printTable(rows []result, direct []directRow) {
	fmt.Println()
	fmt.Printf("%-34s %7s %7s %7s %8s %8s %9s %11s %17s %s\n", "scenario", "sent", "non2xx", "connerr", "p50", "p99", "slowest", "tput/steady", "swap p50/max", "notes")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/1e6) }
	for _, r := range rows {
		swap := "n/a"
		if r.swapsTotal > 0 && r.swapsDone > 0 {
			swap = fmt.Sprintf("%s/%s", ms(r.swapP50), ms(r.swapMax))
		}
		note := r.note
		if r.swapsTotal > 0 {
			note = fmt.Sprintf("%d/%d swaps observed complete", r.swapsDone, r.swapsTotal)
		}
		if r.converge > 0 {
			note += fmt.Sprintf(" (%.1fs after the last change)", r.converge.Seconds())
		}
		fmt.Printf("%-34s %7d %7d %7d %8s %8s %9s %10.0f%% %17s %s\n", r.name, r.sent, r.non2xx, r.connErr, ms(r.p50), ms(r.p99), ms(r.max),
			100*r.rps/r.steadyRPS, swap, note)
	}
	fmt.Println()
	fmt.Printf("%-26s %14s %14s %8s   %-26s %s\n", "steady throughput (wrk)", "direct req/s", "supervisor", "ratio", "p99 direct / supervisor", "server CPU/request direct / supervisor")
	for _, d := range direct {
		fmt.Printf("%-26s %14.0f %14.0f %7.1f%%   %-26s %.1f / %.1f us (%.3fx)\n", d.name, d.direct, d.underSV, 100*d.ratio, d.directP99+" / "+d.svP99,
			d.cpuDirect, d.cpuSV, d.cpuSV/max(d.cpuDirect, 1e-9))
	}
	fmt.Println()
	fmt.Println("targets (supervisor rows): zero failed requests across swaps; slowest request during swaps <= 100ms;")
	fmt.Println("storm throughput >= 90% of steady; steady throughput within 5% of the same worker bound directly.")
	for _, r := range rows {
		if !strings.HasPrefix(r.name, "supervisor") {
			continue
		}
		var fails []string
		if r.non2xx+r.connErr > 0 {
			fails = append(fails, fmt.Sprintf("%d failed requests", r.non2xx+r.connErr))
		}
		if r.max > 100*time.Millisecond {
			fails = append(fails, fmt.Sprintf("slowest %s > 100ms", ms(r.max)))
		}
		if strings.HasSuffix(r.name, "storm") && r.rps < 0.9*r.steadyRPS {
			fails = append(fails, fmt.Sprintf("storm throughput %.0f%% < 90%%", 100*r.rps/r.steadyRPS))
		}
		verdict := "MET"
		if len(fails) > 0 {
			verdict = "MISSED: " + strings.Join(fails, "; ")
		}
		fmt.Printf("  %-32s %s\n", r.name, verdict)
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
