package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// forks runs every exec.Cmd.Start on one OS thread that lives as long as
// the process: a child's parent-death signal fires when the *thread* that
// forked it exits, and the network-namespace helpers (netns.go) end the
// threads they lock. With every fork here, SIGKILL of this program still
// takes the fleet with it, and nothing else does.
var forks = make(chan func())

func init() {
	go func() {
		runtime.LockOSThread()
		for f := range forks {
			f()
		}
	}()
}

// proc is one process the benchmark started.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed once it is reaped
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// signal sends sig unless the process has already been reaped (its pid
// may then belong to someone else).
func (p *proc) signal(sig syscall.Signal) {
	if p.alive() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// procs is every process started, for the stop on exit, and the pid file
// that bench/fleet/run reads to kill leftovers if this program itself is
// killed before it could stop them.
type procs struct {
	mu     sync.Mutex
	list   []*proc
	runDir string
	logDir string
}

func newProcs(runDir string) (*procs, error) {
	ps := &procs{runDir: runDir, logDir: filepath.Join(runDir, "logs")}
	return ps, os.MkdirAll(ps.logDir, 0o755)
}

// start runs argv, output to logs/<name>.log.
func (ps *procs) start(name string, argv ...string) (*proc, error) {
	logPath := filepath.Join(ps.logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	// Without shardvisor's own variables (the run script exports the
	// throwaway ensemble's): every child gets its settings from flags, and a
	// worker must not find a SHARDVISOR_ZK and follow ZooKeeper, not its map.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "SHARDVISOR_") || strings.HasPrefix(kv, "NOTES_")
	})
	// Its own process group, so a Ctrl-C in the terminal reaches only this
	// program, which stops everything in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	errc := make(chan error, 1)
	forks <- func() { errc <- cmd.Start() }
	if err := <-errc; err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if *fleetCPU >= 0 {
		var set unix.CPUSet
		set.Set(*fleetCPU)
		if err := unix.SchedSetaffinity(cmd.Process.Pid, &set); err != nil {
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("%s: pinning to CPU %d: %w", name, *fleetCPU, err)
		}
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.list = append(ps.list, p)
	ps.writePIDs()
	return p, nil
}

// writePIDs drops the reaped processes and rewrites the pid file: "pid
// name" per live process. Called with ps.mu held.
func (ps *procs) writePIDs() {
	ps.list = slices.DeleteFunc(ps.list, func(p *proc) bool { return !p.alive() })
	var b strings.Builder
	for _, p := range ps.list {
		fmt.Fprintf(&b, "%d %s\n", p.pid(), p.name)
	}
	tmp := filepath.Join(ps.runDir, "pids.tmp")
	if os.WriteFile(tmp, []byte(b.String()), 0o644) == nil {
		_ = os.Rename(tmp, filepath.Join(ps.runDir, "pids"))
	}
}

// stop signals the given processes (SIGCONT first: one may be stopped),
// waits up to grace, then SIGKILLs the rest and waits for them.
func (ps *procs) stop(list []*proc, sig syscall.Signal, grace time.Duration) {
	for _, p := range list {
		p.signal(syscall.SIGCONT)
		p.signal(sig)
	}
	deadline := time.After(grace)
	for _, p := range list {
		select {
		case <-p.done:
		case <-deadline:
			for _, q := range list {
				q.signal(syscall.SIGKILL)
			}
			<-p.done
		}
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.writePIDs()
}

// stopAll stops everything still running: supervisors with QUIT (fast
// stop: their workers get SIGKILL; the load is over by then), the rest
// with TERM.
func (ps *procs) stopAll() {
	ps.mu.Lock()
	all := slices.Clone(ps.list)
	ps.mu.Unlock()
	sup := func(p *proc) bool { return strings.HasPrefix(p.name, "sv-") }
	ps.stop(slices.DeleteFunc(slices.Clone(all), func(p *proc) bool { return !sup(p) }), syscall.SIGQUIT, 15*time.Second)
	ps.stop(slices.DeleteFunc(all, sup), syscall.SIGTERM, 10*time.Second)
}
