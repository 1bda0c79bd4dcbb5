package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/testkit"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
	"github.com/shardvisor/shardvisor/zksession"
)

// TestMain lets the test binary be the exec shim, so tests run real
// processes; the workers are internal/testworker (workerExe).
func TestMain(m *testing.M) {
	MaybeRunShim()
	if len(os.Args) > 2 && os.Args[1] == "__notify-send" {
		// An sd_notify client that is not the worker (notify_test.go):
		// sends os.Args[2] to $NOTIFY_SOCKET and says how it went.
		if _, err := workerproto.Notify(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	code := m.Run()
	svBuilt.remove()
	workerBuilt.remove()
	os.Exit(code)
}

// built is a binary of the module, built once per test process into a
// temporary directory that TestMain removes.
type built struct {
	pkg, name string
	once      sync.Once
	path      string
	err       error
}

var (
	// cmd/supervisor, for tree_test.go's real processes.
	svBuilt = &built{pkg: "./cmd/supervisor", name: "supervisor"}
	// The workers: without -race (see internal/testworker's comment).
	workerBuilt = &built{pkg: "./internal/testworker", name: "testworker"}
)

func (b *built) get(t *testing.T) string {
	t.Helper()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "shardvisor-test-"+b.name+"-")
		if err != nil {
			b.err = err
			return
		}
		bin := filepath.Join(dir, b.name)
		cmd := exec.Command("go", "build", "-o", bin, b.pkg)
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
			return
		}
		b.path = bin
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

func (b *built) remove() {
	if b.path != "" {
		os.RemoveAll(filepath.Dir(b.path))
	}
}

// workerExe is the test worker's path.
func workerExe(t *testing.T) string { return workerBuilt.get(t) }

func testExe(t *testing.T) string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// cfgFor is a pool config running the test worker.
func cfgFor(t *testing.T, port int, workers int, env map[string]string) *topo.PoolConfig {
	surge := workers
	// Without the stability checks: the tests from before them expect a
	// swap to complete at READY=1; stability_test.go turns them on.
	off := topo.Duration(0)
	return &topo.PoolConfig{
		Stability:       topo.Stability{Window: &off, RollbackWithin: &off},
		Version:         topo.PoolConfigVersion,
		Command:         workerExe(t),
		Env:             env,
		Workers:         workers,
		Listen:          []topo.Listen{{Name: "http", Addr: fmt.Sprintf("tcp://127.0.0.1:%d", port)}},
		GracefulTimeout: topo.Duration(5 * time.Second),
		Readiness:       topo.Readiness{Timeout: topo.Duration(20 * time.Second)},
		Surge:           &surge,
		Restart:         topo.Backoff{Initial: topo.Duration(200 * time.Millisecond), Max: topo.Duration(2 * time.Second)},
	}
}

func encode(t *testing.T, c *topo.PoolConfig) []byte {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatalf("test config invalid: %v", err)
	}
	b, err := topo.EncodePoolConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fileLogger writes the supervisor's logs to a file that is printed when
// the test fails (logging to t after the test ends would panic).
func fileLogger(t *testing.T, dir string) (*zap.Logger, *os.File) {
	f, err := os.Create(filepath.Join(dir, "test.log"))
	if err != nil {
		t.Fatal(err)
	}
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	log := zap.New(zapcore.NewCore(enc, zapcore.AddSync(f), zapcore.DebugLevel))
	t.Cleanup(func() {
		testkit.LogTail(t, f.Name(), "supervisor and worker log")
		f.Close()
	})
	return log, f
}

type harness struct {
	t    *testing.T
	sv   *Supervisor
	dir  string
	done chan error
	port int
}

// run starts a supervisor in-process; it is stopped (gracefully, then
// checked for leftover workers) when the test ends.
func run(t *testing.T, opts Options) *harness {
	t.Helper()
	dir := t.TempDir()
	log, f := fileLogger(t, dir)
	if opts.Pool == "" {
		opts.Pool = "web"
	}
	opts.Logger = log
	opts.Stdout, opts.Stderr = f, f
	if opts.StateDir == "" {
		opts.StateDir = filepath.Join(dir, "state")
	}
	if opts.AdminAddr == "" {
		opts.AdminAddr = "127.0.0.1:0"
	}
	if opts.Debounce == 0 {
		opts.Debounce = 50 * time.Millisecond
	}
	sv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, sv: sv, dir: dir, done: make(chan error, 1)}
	go func() { h.done <- sv.Run(context.Background()) }()
	t.Cleanup(func() {
		pids := h.pids()
		sv.Stop(false)
		select {
		case err := <-h.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("supervisor did not stop within 30s")
		}
		for _, p := range pids {
			if alive(p) {
				t.Errorf("worker %d still alive after the supervisor stopped", p)
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
	})
	return h
}

func (h *harness) pids() []int {
	var out []int
	for _, w := range h.sv.Status().Workers {
		out = append(out, w.PID)
	}
	return out
}

// waitFor polls cond (generous bound: only "eventually" matters).
func (h *harness) waitFor(timeout time.Duration, what string, cond func(m topo.PoolMember) bool) topo.PoolMember {
	h.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m := h.sv.Status()
		if cond(m) {
			return m
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(m, "", " ")
			h.t.Fatalf("timed out after %s waiting for %s; status %s", timeout, what, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// onMap: every ready worker routes by map version v or later (reload
// mode: acknowledged).
func onMap(v uint64) func(topo.PoolMember) bool {
	return func(m topo.PoolMember) bool { return m.MapVersion >= v }
}

// serving: generation gen (0 = any) established with n ready workers of it
// and nothing else running.
func serving(gen int64, n int) func(topo.PoolMember) bool {
	return func(m topo.PoolMember) bool {
		if m.State != "serving" || (gen != 0 && m.Generation != gen) || len(m.Workers) != n {
			return false
		}
		for _, w := range m.Workers {
			if w.State != "ready" || w.Generation != m.Generation {
				return false
			}
		}
		return true
	}
}

var client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func get(addr string) (testkit.WorkerReply, error) {
	var r testkit.WorkerReply
	resp, err := client.Get("http://" + addr + "/")
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return r, fmt.Errorf("status %d", resp.StatusCode)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}

// load hits addr from a few goroutines with a new connection per request
// (the strictest case: every request needs an accept) and counts failures.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       []string
	tags       map[string]int
	stop       chan struct{}
	wg         sync.WaitGroup
}

func startLoad(addr string, conc int) *load {
	l := &load{stop: make(chan struct{}), tags: map[string]int{}}
	for i := 0; i < conc; i++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			testkit.Until(l.stop, func(int) bool {
				r, err := get(addr)
				l.mu.Lock()
				if err != nil {
					l.failed.Add(1)
					if len(l.errs) < 10 {
						l.errs = append(l.errs, time.Now().UTC().Format("15:04:05.000000")+" "+err.Error())
					}
				} else {
					l.ok.Add(1)
					l.tags[r.Tag]++
				}
				l.mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				return true
			})
		}()
	}
	return l
}

// waitTag waits until the load has had n answers tagged tag in all (the
// new generation serves it).
func (l *load) waitTag(t *testing.T, tag string, n int) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.tags[tag] >= n
	}, fmt.Sprintf("%d answers tagged %q under load", n, tag))
}

func (l *load) finish(t *testing.T) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	t.Logf("load: %d ok, %d failed, by tag %v", l.ok.Load(), l.failed.Load(), l.tags)
	if l.failed.Load() > 0 {
		t.Errorf("%d requests failed during swaps, e.g. %v", l.failed.Load(), l.errs)
	}
	if l.ok.Load() == 0 {
		t.Errorf("no request succeeded")
	}
}

func alive(pid int) bool {
	p, err := readProcStat(pid)
	return err == nil && p.live()
}

// zkEnv is a chrooted session and paths for one test.
type zkEnv struct {
	z     *testenv.ZK
	s     *zksession.Session // the test's own (admin) session
	paths topo.Paths
}

func startZK(t *testing.T) *zkEnv {
	z := testenv.StartZK(t)
	s := zktest.Session(t, zksession.Config{Connect: z.ConnectString + z.Root})
	return &zkEnv{z: z, s: s, paths: topo.MustPaths("/shardvisor", "c1")}
}

func (e *zkEnv) put(t *testing.T, p string, data []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.s.Set(ctx, p, data, zksession.AnyVersion); errors.Is(err, zksession.ErrNoNode) {
		if err := e.s.CreateAll(ctx, filepath.Dir(p)); err != nil {
			t.Fatal(err)
		}
		if err := e.s.Create(ctx, p, data); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
}

func (e *zkEnv) setConfig(t *testing.T, c *topo.PoolConfig) {
	e.put(t, e.paths.PoolConfig("web"), encode(t, c))
}

func (e *zkEnv) status(t *testing.T) *topo.PoolStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, _, err := e.s.Get(ctx, e.paths.PoolStatus("web"))
	if err != nil {
		return nil
	}
	st, err := topo.DecodePoolStatus("", b)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (e *zkEnv) waitStatus(t *testing.T, what string, cond func(*topo.PoolStatus) bool) *topo.PoolStatus {
	t.Helper()
	var st *topo.PoolStatus
	testenv.WaitFor(t, 20*time.Second, func() bool { st = e.status(t); return st != nil && cond(st) }, what)
	return st
}

func (e *zkEnv) opts(t *testing.T, connect string, timeout time.Duration) Options {
	ss := zktest.Session(t, zksession.Config{Connect: connect, SessionTimeout: timeout, OpTimeout: 2 * time.Second})
	return Options{Session: ss, Paths: e.paths, Member: "m1"}
}

func lockedThreadChurn(n int) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // exits the thread when the goroutine returns
			time.Sleep(time.Millisecond)
		}()
	}
	wg.Wait()
}

func goBuild(t *testing.T, pkg, out string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = ".."
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

// testCounter sums the metric samples of name whose labels contain match.
func testCounter(t *testing.T, h *harness, name, match string) float64 {
	t.Helper()
	mfs, err := h.sv.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			if match != "" && !strings.Contains(strings.Join(labels, ","), match) {
				continue
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			} else if g := m.GetGauge(); g != nil {
				sum += g.GetValue()
			}
		}
	}
	return sum
}

func execCommand(name string, args ...string) *exec.Cmd { return exec.Command(name, args...) }

func jsonDecode(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }

func httpBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func httpCode(url string) int {
	resp, err := client.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
