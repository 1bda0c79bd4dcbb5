package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shardvisor/shardvisor/topo"
)

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
