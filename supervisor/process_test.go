package supervisor

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
)

// The executor through its process seam: a fake startProcess records what
// would have been forked, so the worker protocol (environment, sockets,
// shim arguments) and the executor's side of exits and failed starts are
// checked without running a process or a server.

type fakeProc struct {
	n      int
	spec   procSpec
	notify func(workerproto.Message)
	exited func(string)

	mu     sync.Mutex
	sigs   []syscall.Signal
	killed bool
}

func (p *fakeProc) pid() int { return 50000 + p.n }
func (p *fakeProc) signal(sig syscall.Signal) {
	p.mu.Lock()
	p.sigs = append(p.sigs, sig)
	p.mu.Unlock()
}
func (p *fakeProc) killGroup() {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
}

type fakeOS struct {
	mu      sync.Mutex
	procs   []*fakeProc
	failNth map[int]error // the n-th start (from 1) fails
	started chan *fakeProc
}

func newFakeOS() *fakeOS {
	return &fakeOS{failNth: map[int]error{}, started: make(chan *fakeProc, 64)}
}

func (f *fakeOS) start(spec procSpec, ev procEvents) (process, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.procs) + 1
	p := &fakeProc{n: n, spec: spec, notify: ev.notify, exited: ev.exited}
	f.procs = append(f.procs, p)
	if err := f.failNth[n]; err != nil {
		return nil, err
	}
	f.started <- p
	return p, nil
}

func (f *fakeOS) next(t *testing.T) *fakeProc {
	t.Helper()
	return testenv.Receive(t, f.started, 10*time.Second, "no worker started")
}

func envOf(p *fakeProc) map[string]string {
	m := map[string]string{}
	for _, kv := range p.spec.env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// runFake runs a supervisor on a local config file with the fake seam.
func runFake(t *testing.T, cfg string, setup ...func(*fakeOS)) (*Supervisor, *fakeOS, func()) {
	t.Helper()
	return runFakeEnv(t, osEnv, cfg, setup...)
}

// runFakeEnv is runFake with the process environment e.
func runFakeEnv(t *testing.T, e *env, cfg string, setup ...func(*fakeOS)) (*Supervisor, *fakeOS, func()) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "pool.json")
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	sv, err := newSupervisor(e, Options{Pool: "fake", ConfigFile: file, ConfigPoll: 20 * time.Millisecond, StateDir: filepath.Join(dir, "state"),
		ShimPath: "/usr/lib/shim", Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sv.mc.cfg.jitter = 0
	fos := newFakeOS()
	for _, f := range setup {
		f(fos)
	}
	sv.start = fos.start
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sv.Run(ctx) }()
	stop := func() {
		cancel()
		// The fake workers exit when told to stop.
		deadline := time.After(10 * time.Second)
		for {
			select {
			case err := <-done:
				if err != nil {
					t.Error(err)
				}
				return
			case <-deadline:
				t.Fatal("supervisor did not stop")
			case <-time.After(10 * time.Millisecond):
				fos.mu.Lock()
				for _, p := range fos.procs {
					p.mu.Lock()
					if (len(p.sigs) > 0 || p.killed) && p.exited != nil {
						go p.exited("exit status 0")
						p.exited = nil
					}
					p.mu.Unlock()
				}
				fos.mu.Unlock()
			}
		}
	}
	return sv, fos, stop
}

func waitStatus(t *testing.T, sv *Supervisor, what string, cond func(topo.PoolMember) bool) topo.PoolMember {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := sv.Status()
		if cond(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %+v", what, m)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestExecutorHandsWorkersTheProtocol(t *testing.T) {
	// The supervisor's own service manager variables must not reach a
	// worker: each worker gets its own.
	t.Setenv(workerproto.EnvNotifySocket, "@not-for-workers")
	t.Setenv(workerproto.EnvListenFDs, "7")
	t.Setenv("KEEP_ME", "1")
	sv, fos, stop := runFake(t, `{"version":1,"command":"app","args":["--x"],"workers":2,"env":{"KEEP_ME":"2"},
		"listen":[{"name":"web","addr":"tcp://127.0.0.1:0"}],"watchdog":"2s"}`)
	defer stop()
	p1, p2 := fos.next(t), fos.next(t)
	for i, p := range []*fakeProc{p1, p2} {
		env := envOf(p)
		want := map[string]string{workerproto.EnvListenFDs: "1", workerproto.EnvListenFDNames: "web", workerproto.EnvGeneration: "1",
			workerproto.EnvWatchdogUSec: "2000000", "KEEP_ME": "2"}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("worker %d: %s=%q, want %q", i+1, k, env[k], v)
			}
		}
		if _, ok := env[workerproto.EnvNotifySocket]; ok {
			t.Errorf("worker %d inherited the supervisor's NOTIFY_SOCKET", i+1)
		}
		if !slices.Equal(p.spec.args, []string{"/usr/lib/shim", ShimArg, "app", "--x"}) {
			t.Errorf("args %q", p.spec.args)
		}
		if len(p.spec.files) != 1 {
			t.Fatalf("%d sockets passed, want 1", len(p.spec.files))
		}
		l, err := net.FileListener(p.spec.files[0])
		if err != nil {
			t.Fatalf("fd 3 is not a listening socket: %v", err)
		}
		l.Close()
	}
	if envOf(p1)[workerproto.EnvWorkerID] == envOf(p2)[workerproto.EnvWorkerID] {
		t.Error("two workers with one SHARDVISOR_WORKER_ID")
	}
	p1.notify(workerproto.Message{Ready: true})
	p2.notify(workerproto.Message{Ready: true})
	waitStatus(t, sv, "serving", func(m topo.PoolMember) bool { return m.State == "serving" && m.Accepting })

	// An exit is reaped (its process group killed) and, after the
	// restart backoff, replaced.
	p1.exited("signal: segmentation fault")
	p3 := fos.next(t)
	p1.mu.Lock()
	reaped := p1.killed
	p1.mu.Unlock()
	if !reaped {
		t.Error("the exited worker's process group was not killed")
	}
	if envOf(p3)[workerproto.EnvGeneration] != "1" {
		t.Errorf("respawn in generation %s", envOf(p3)[workerproto.EnvGeneration])
	}
}

func TestExecutorFailedStartFailsTheSwap(t *testing.T) {
	sv, fos, stop := runFake(t, `{"version":1,"command":"app","workers":3,"restart":{"initial":"1h"}}`, func(f *fakeOS) {
		f.failNth[1] = errors.New("fork/exec: resource temporarily unavailable")
	})
	defer stop()
	m := waitStatus(t, sv, "the swap to fail", func(m topo.PoolMember) bool { return m.LastError != "" })
	if !strings.Contains(m.LastError, "swap failed: starting a worker: start app: fork/exec") {
		t.Fatalf("last error %q", m.LastError)
	}
	time.Sleep(100 * time.Millisecond) // deliberate: no other start may follow for a while
	fos.mu.Lock()
	n := len(fos.procs)
	fos.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d starts attempted, want 1: the rest of the batch is dropped and the retry waits an hour", n)
	}
}
