package supervisor

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// procStat is what the process-tree code reads from /proc/PID/stat.
type procStat struct {
	pid, ppid, pgrp int
	state           byte   // R, S, D, Z, T...
	threads         int    // live threads
	start           uint64 // start time in clock ticks after boot: tells a reused pid apart
	rss             int64  // resident set size in pages
}

// live: not a zombie, or a zombie leader whose other threads still run.
func (p procStat) live() bool {
	return !(p.state == 'Z' || p.state == 'X') || p.threads > 1
}

// parseStat parses one /proc/PID/stat ("pid (comm) state ppid pgrp ...";
// comm may hold spaces and parentheses, so fields are counted after its
// last ')').
func parseStat(b []byte) (procStat, error) {
	var p procStat
	i := bytes.IndexByte(b, ' ')
	j := bytes.LastIndexByte(b, ')')
	if i < 0 || j < i {
		return p, fmt.Errorf("unexpected /proc stat format %q", b)
	}
	f := strings.Fields(string(b[j+1:]))
	// After comm: state(3) ppid(4) pgrp(5) ... num_threads(20) ...
	// starttime(22) vsize(23) rss(24).
	if len(f) < 22 || len(f[0]) != 1 {
		return p, fmt.Errorf("unexpected /proc stat format %q", b)
	}
	var err error
	p.state = f[0][0]
	if p.pid, err = strconv.Atoi(string(b[:i])); err != nil {
		return p, err
	}
	if p.ppid, err = strconv.Atoi(f[1]); err != nil {
		return p, err
	}
	if p.pgrp, err = strconv.Atoi(f[2]); err != nil {
		return p, err
	}
	if p.threads, err = strconv.Atoi(f[17]); err != nil {
		return p, err
	}
	if p.start, err = strconv.ParseUint(f[19], 10, 64); err != nil {
		return p, err
	}
	p.rss, err = strconv.ParseInt(f[21], 10, 64)
	return p, err
}

// readProcStat reads one process's stat.
func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

// readProcs reads every process in /proc; ones that exit meanwhile are
// left out.
func readProcs() ([]procStat, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	out := make([]procStat, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if p, err := readProcStat(pid); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// descendants is every process below root in procs, parents before
// children.
func descendants(root int, procs []procStat) []procStat {
	kids := map[int][]procStat{}
	for _, p := range procs {
		if p.pid != p.ppid {
			kids[p.ppid] = append(kids[p.ppid], p)
		}
	}
	var out []procStat
	seen := map[int]bool{root: true}
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range kids[pid] {
			if !seen[c.pid] {
				seen[c.pid] = true
				out = append(out, c)
				queue = append(queue, c.pid)
			}
		}
	}
	return out
}

// killDescendants SIGKILLs every process below root, again and again
// (a process may fork until it is killed; a killed one takes a moment to
// become a zombie) until none is alive or timeout passes, and says how
// many were still alive then. Run by a subreaper, it finds orphans of the
// tree too. A pid is signalled microseconds after /proc showed it below
// root: another process could get it only if it died, was reaped and the
// whole pid space wrapped around in between.
func killDescendants(root int, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		procs, err := readProcs()
		if err != nil {
			return -1
		}
		live := 0
		for _, p := range descendants(root, procs) {
			if p.live() {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
				live++
			}
		}
		if live == 0 || time.Now().After(deadline) {
			return live
		}
		time.Sleep(time.Millisecond)
	}
}
