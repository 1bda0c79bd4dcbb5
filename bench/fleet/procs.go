package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
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
	done chan struct{}
	err  error // set before done closes
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
	mu      sync.Mutex
	list    []*proc
	pidFile string
	logDir  string
}

func newProcs(runDir string) (*procs, error) {
	ps := &procs{pidFile: filepath.Join(runDir, "pids"), logDir: filepath.Join(runDir, "logs")}
	if err := os.MkdirAll(ps.logDir, 0o755); err != nil {
		return nil, err
	}
	return ps, nil
}

// start runs argv with env (the whole environment), output to
// logs/<name>.log.
func (ps *procs) start(name string, argv, env []string) (*proc, error) {
	logPath := filepath.Join(ps.logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group, so a Ctrl-C in the terminal reaches only this
	// program, which stops everything in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	errc := make(chan error, 1)
	forks <- func() { errc <- cmd.Start() }
	if err := <-errc; err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	ps.mu.Lock()
	ps.list = append(ps.list, p)
	ps.writePIDs()
	ps.mu.Unlock()
	return p, nil
}

// writePIDs rewrites the pid file: "pid name" per live process. Called
// with ps.mu held.
func (ps *procs) writePIDs() {
	var b strings.Builder
	for _, p := range ps.list {
		if p.alive() {
			fmt.Fprintf(&b, "%d %s\n", p.pid(), p.name)
		}
	}
	tmp := ps.pidFile + ".tmp"
	if os.WriteFile(tmp, []byte(b.String()), 0o644) == nil {
		_ = os.Rename(tmp, ps.pidFile)
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
	keep := ps.list[:0]
	for _, p := range ps.list {
		if p.alive() {
			keep = append(keep, p)
		}
	}
	ps.list = keep
	ps.writePIDs()
	ps.mu.Unlock()
}

// stopAll stops everything still running: supervisors with QUIT (fast
// stop: their workers get SIGKILL; the load is over by then), the rest
// with TERM.
func (ps *procs) stopAll() {
	ps.mu.Lock()
	list := append([]*proc(nil), ps.list...)
	ps.mu.Unlock()
	var sups, rest []*proc
	for _, p := range list {
		if strings.HasPrefix(p.name, "sv-") {
			sups = append(sups, p)
		} else {
			rest = append(rest, p)
		}
	}
	ps.stop(sups, syscall.SIGQUIT, 15*time.Second)
	ps.stop(rest, syscall.SIGTERM, 10*time.Second)
}

// childEnv is this process's environment without shardvisor's own
// variables (the run script exports the throwaway ensemble's), plus extra:
// every child gets its settings from flags, and a worker must not find a
// SHARDVISOR_ZK and follow ZooKeeper instead of its map file.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SHARDVISOR_") || strings.HasPrefix(kv, "NOTES_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}
