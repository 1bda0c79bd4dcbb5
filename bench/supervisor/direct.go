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
	"strconv"
	"strings"
	"time"

	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/topo"
)

// directRow is one worker's figures, bound directly and under the
// supervisor; the JSON results hold all but the p99s.
type directRow struct {
	Name      string    `json:"name"`
	Direct    float64   `json:"direct_rps"`     // median, req/s
	UnderSV   float64   `json:"supervisor_rps"` // median, req/s
	Ratio     float64   `json:"ratio"`          // median of the rounds' supervisor/direct ratios
	CPUDirect float64   `json:"cpu_per_request_direct_us"`
	CPUSV     float64   `json:"cpu_per_request_supervisor_us"` // medians: server process tree CPU per request, µs
	Ratios    []float64 `json:"round_ratios"`
	directP99 string
	svP99     string
}

// cpuRatio is the supervisor's CPU per request against the direct one's.
func (d directRow) cpuRatio() float64 { return d.CPUSV / max(d.CPUDirect, 1e-9) }

// directComparison measures steady throughput with wrk: gunicorn bound
// directly vs gunicorn under the supervisor, and the Go worker bound
// directly vs under the supervisor (one process each, so the port needs
// no sharing).
func directComparison(tmp, hello, svBin, appDir string) []directRow {
	fmt.Println("== bound directly vs under the supervisor (wrk)")
	var rows []directRow
	// Both run side by side (an idle server costs nothing); wrk alternates
	// between them for -rounds rounds and the median counts, so drift of the
	// machine (TIME_WAIT build-up, other load) hits both alike.
	compare := func(name string, cmds [2]*exec.Cmd, ports [2]int, hdr ...string) {
		waitTimeWait()
		for i, side := range []string{"direct", "supervisor"} {
			cmds[i].Stderr = logFile(tmp, "direct.log")
			stop, err := serve(pin(cmds[i], true), ports[i], time.Minute)
			if err != nil {
				fmt.Fprintln(os.Stderr, name, side+":", err)
				return
			}
			defer stop()
		}
		// Paired rounds: each round measures both sides back to back, in
		// alternating order (so that neither always runs on the TIME_WAIT
		// sockets the other left, or first after a pause), and the median
		// of the rounds' ratios is the figure.
		var rps, cpu [2][]float64
		var p99 [2]string
		var ratios []float64
		for i := range *rounds {
			var r [2]float64
			for _, s := range [][]int{{0, 1}, {1, 0}}[i%2] {
				var c float64
				r[s], p99[s], c = wrkRound(cmds[s].Process.Pid, ports[s], hdr...)
				rps[s], cpu[s] = append(rps[s], r[s]), append(cpu[s], c)
			}
			if r[0] > 0 {
				ratios = append(ratios, r[1]/r[0])
			}
		}
		med := func(v []float64) float64 { return benchkit.Of(v).P50 }
		rows = append(rows, directRow{Name: name, Direct: med(rps[0]), UnderSV: med(rps[1]), Ratio: med(ratios), Ratios: ratios, directP99: p99[0], svP99: p99[1],
			CPUDirect: med(cpu[0]), CPUSV: med(cpu[1])})
	}
	svCmd := func(name string, cfg topo.PoolConfig) *exec.Cmd {
		file := filepath.Join(tmp, name+".json")
		b, _ := topo.EncodePoolConfig(&cfg)
		_ = os.WriteFile(file, b, 0o644)
		c := exec.Command(svBin, "--config", file, "--admin", "", "--pool", name, "--state-dir", filepath.Join(tmp, name), "--log-level", "warn")
		// scripts/devenv env's SHARDVISOR_ZK (and the rest) would make it
		// refuse --config: a file-config supervisor sees none of them.
		c.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "SHARDVISOR_") })
		return c
	}
	listen := func(port int) []topo.Listen {
		return []topo.Listen{{Name: "http", Addr: fmt.Sprintf("tcp://127.0.0.1:%d", port)}}
	}

	ports := [2]int{freePort(), freePort()}
	d := exec.Command("gunicorn", "--preload", "--workers", strconv.Itoa(*workers), "--bind", fmt.Sprintf("127.0.0.1:%d", ports[0]), "--chdir", appDir, "--log-level", "warning", "wsgi_app:application")
	d.Env = append(os.Environ(), "APP_STARTUP_DELAY=0")
	sv := svCmd("direct-gunicorn", topo.PoolConfig{Version: 1, Command: "gunicorn", Workers: *workers, Env: map[string]string{"APP_STARTUP_DELAY": "0"},
		Args: []string{"--preload", "--workers", "1", "--chdir", appDir, "--log-level", "warning", "wsgi_app:application"}, Listen: listen(ports[1])})
	// gunicorn's sync workers close every connection: tell wrk so.
	compare(fmt.Sprintf("gunicorn, %d workers", *workers), [2]*exec.Cmd{d, sv}, ports, "-H", "Connection: close")

	ports = [2]int{freePort(), freePort()}
	d = exec.Command(hello)
	d.Env = append(os.Environ(), fmt.Sprintf("HELLO_ADDR=127.0.0.1:%d", ports[0]))
	sv = svCmd("direct-go", topo.PoolConfig{Version: 1, Command: hello, Workers: 1, Listen: listen(ports[1])})
	compare("go worker, 1 process", [2]*exec.Cmd{d, sv}, ports)
	return rows
}

// wrkRound runs one wrk round against the server on port and returns,
// besides its figures, the CPU time the server's whole process tree (root
// and every descendant: supervisor, arbiters, workers) spent per request.
// On a saturated 2-core machine shared with wrk, throughput swings by
// 10-20% from round to round; the CPU cost of a request barely moves, and
// it is what the supervisor could add.
func wrkRound(root, port int, hdr ...string) (rps float64, p99 string, usPerReq float64) {
	c0 := treeCPU(root)
	args := append([]string{"-t", "2", "-c", strconv.Itoa(*conc), "-d", "3s", "--latency"}, hdr...)
	out, err := pin(exec.Command("wrk", append(args, httpURL(port))...), false).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "wrk: %v\n%s", err, out)
		return 0, "?", 0
	}
	m := regexp.MustCompile(`Requests/sec:\s+([\d.]+)`).FindSubmatch(out)
	n := regexp.MustCompile(`(\d+) requests in`).FindSubmatch(out)
	if m == nil || n == nil {
		return 0, "?", 0
	}
	rps, _ = strconv.ParseFloat(string(m[1]), 64)
	if reqs, _ := strconv.ParseFloat(string(n[1]), 64); reqs > 0 {
		usPerReq = float64((treeCPU(root) - c0).Microseconds()) / reqs
	}
	p99 = "?"
	if p := regexp.MustCompile(`99%\s+(\S+)`).FindSubmatch(out); p != nil {
		p99 = string(p[1])
	}
	return rps, p99, usPerReq
}

// pin makes c (not started yet) run under taskset with -pin, a server on
// the first CPU and wrk on the others, so that they do not trade cores
// from round to round, and returns it; the program keeps the same pid
// (taskset execs it), so its process tree is measured as before.
func pin(c *exec.Cmd, server bool) *exec.Cmd {
	if !*pinCPUs {
		return c
	}
	cpus := fmt.Sprintf("1-%d", runtime.NumCPU()-1)
	if server {
		cpus = "0"
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
	parent, ticks := map[int]int{}, map[int]int64{}
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
