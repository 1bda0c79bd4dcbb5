package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
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

// TestMain lets the test binary be the exec shim and a worker, so tests
// run real processes without building anything.
func TestMain(m *testing.M) {
	MaybeRunShim()
	if len(os.Args) > 1 && os.Args[1] == "__test-worker" {
		os.Exit(testWorker())
	}
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
	if svBin != "" {
		os.RemoveAll(filepath.Dir(svBin)) // the binary tree_test.go built
	}
	os.Exit(code)
}

// testWorker is a systemd-style worker controlled by environment:
// TW_DELAY (before serving), TW_MODE (exit at boot, noready: stuck before
// serving, hang: no watchdog pings, daemon: leave a setsid'd daemon,
// broken: READY=1, then 500 to every request),
// TW_CRASH_AFTER (exit 7 that long after READY=1; with TW_CRASH_DRAIN=1 it
// first stops accepting and answers what it accepted, so a test sees only
// what the supervisor does), TW_HANG_AFTER (every request hangs from then
// on, while watchdog pings go on; only the worker TW_HANG_WORKER if set),
// TW_TAG (echoed back), TW_REPORT_REQUESTS=1 (REQUESTS=N after every
// request), TW_GROW (MiB to allocate and touch once ready; only the worker
// TW_GROW_WORKER if set).
func testWorker() int {
	pid := os.Getpid()
	if os.Getenv("LISTEN_PID") != strconv.Itoa(pid) {
		fmt.Fprintf(os.Stderr, "test worker %d: LISTEN_PID=%q is not my pid\n", pid, os.Getenv("LISTEN_PID"))
		return 4
	}
	if d, err := time.ParseDuration(os.Getenv("TW_DELAY")); err == nil {
		time.Sleep(d)
	}
	mode := os.Getenv("TW_MODE")
	if mode == "daemon" {
		// Double fork, setsid, keep the listen socket: a daemon that
		// escapes the worker's process group and holds the port.
		cmd := exec.Command("/bin/sh", "-c", "setsid sleep 3600 </dev/null >/dev/null 2>&1 &")
		if fd, err := syscall.Dup(3); err == nil {
			cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(fd), "listen")}
		}
		err := cmd.Run()
		for _, f := range cmd.ExtraFiles {
			f.Close()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "test worker: daemon: %v\n", err)
			return 8
		}
	}
	if mode == "noready" {
		time.Sleep(time.Hour) // stuck in initialisation: never accepts, never ready
	}
	if mode == "exit" {
		fmt.Fprintf(os.Stderr, "test worker %d: exiting at boot as told\n", pid)
		return 3
	}
	// The map it routes by. In reload mode it follows the file (unless
	// TW_MAPMODE=silent: a worker that cannot reload) and acknowledges.
	var mapMu sync.Mutex
	var mapData, mapVersion string
	if f := os.Getenv("SHARDVISOR_MAP_FILE"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(os.Stderr, "test worker: map file: %v\n", err)
			return 5
		}
		mapData, mapVersion = string(b), os.Getenv("SHARDVISOR_MAP_VERSION")
		if fl, ok := workerproto.MapFollowFromEnv(); ok && fl.Reload && os.Getenv("TW_MAPMODE") != "silent" {
			cur, _ := strconv.ParseUint(mapVersion, 10, 64)
			go workerproto.FollowMapFile(context.Background(), fl, cur, func(b []byte) (uint64, error) {
				var doc struct {
					Map struct {
						Version uint64 `json:"map_version"`
					} `json:"map"`
				}
				if err := json.Unmarshal(b, &doc); err != nil {
					return 0, err
				}
				mapMu.Lock()
				mapData, mapVersion = string(b), strconv.FormatUint(doc.Map.Version, 10)
				mapMu.Unlock()
				return doc.Map.Version, nil
			}, nil)
		}
	}
	n, _ := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	names := strings.Split(os.Getenv("LISTEN_FDNAMES"), ":")
	// Go's Server.Shutdown drops a connection that was accepted but whose
	// first request is read after Shutdown began (net/http returns from
	// conn.serve when shuttingDown). So on SIGTERM: close the listeners
	// (stop accepting), wait until every accepted connection has had its
	// request read, then Shutdown. examples/hello does the same.
	var lns []net.Listener
	var hung atomic.Bool
	if d, err := time.ParseDuration(os.Getenv("TW_HANG_AFTER")); err == nil {
		if wid := os.Getenv("TW_HANG_WORKER"); wid == "" || wid == os.Getenv("SHARDVISOR_WORKER_ID") {
			time.AfterFunc(d, func() { hung.Store(true) })
		}
	}
	var served atomic.Uint64
	report := os.Getenv("TW_REPORT_REQUESTS") == "1"
	var serving sync.WaitGroup // Serve loops: each ends after its last Accept
	var mu sync.Mutex
	fresh := map[net.Conn]bool{}
	srv := &http.Server{ConnState: func(c net.Conn, st http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		if st == http.StateNew {
			fresh[c] = true
		} else {
			delete(fresh, c)
		}
	}, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hung.Load() {
			select {} // a deadlocked handler: answers nothing, ever
		}
		if mode == "broken" {
			// A broken deploy that boots: READY=1, then 500 to everything.
			http.Error(w, "broken deploy", http.StatusInternalServerError)
			return
		}
		mapMu.Lock()
		rep := workerReply{PID: pid, Gen: os.Getenv("SHARDVISOR_GENERATION"), Tag: os.Getenv("TW_TAG"),
			MapVersion: mapVersion, MapFile: os.Getenv("SHARDVISOR_MAP_FILE"), Map: mapData, FDNames: names}
		mapMu.Unlock()
		_ = json.NewEncoder(w).Encode(rep)
		if n := served.Add(1); report {
			_, _ = workerproto.Notify(workerproto.RequestsReport(n))
		}
	})}
	for i := 0; i < n; i++ {
		f := os.NewFile(uintptr(3+i), names[i])
		ln, err := net.FileListener(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "test worker: fd %d: %v\n", 3+i, err)
			return 6
		}
		lns = append(lns, ln)
		serving.Add(1)
		go func() { defer serving.Done(); _ = srv.Serve(ln) }()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	_, _ = workerproto.Notify("READY=1")
	var grown [][]byte
	if mib, err := strconv.Atoi(os.Getenv("TW_GROW")); err == nil {
		if wid := os.Getenv("TW_GROW_WORKER"); wid == "" || wid == os.Getenv("SHARDVISOR_WORKER_ID") {
			for i := 0; i < mib; i++ {
				b := make([]byte, 1<<20)
				for j := 0; j < len(b); j += 4096 {
					b[j] = 1 // every page touched: resident
				}
				grown = append(grown, b)
			}
		}
	}
	defer runtime.KeepAlive(grown)
	if usec, _ := strconv.Atoi(os.Getenv("WATCHDOG_USEC")); usec > 0 && mode != "hang" {
		go func() {
			for range time.Tick(time.Duration(usec) * time.Microsecond / 3) {
				_, _ = workerproto.Notify("WATCHDOG=1")
			}
		}()
	}
	crash := make(<-chan time.Time)
	if d, err := time.ParseDuration(os.Getenv("TW_CRASH_AFTER")); err == nil {
		if os.Getenv("TW_CRASH_DRAIN") != "1" {
			time.Sleep(d)
			return 7
		}
		crash = time.After(d)
	}
	code := 0
	select {
	case <-sig:
	case <-crash:
		fmt.Fprintf(os.Stderr, "test worker %d: crashing as told (after draining)\n", pid)
		code = 7
	}
	for _, ln := range lns {
		ln.Close()
	}
	serving.Wait() // now every accepted connection is registered as new
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		mu.Lock()
		n := len(fresh)
		mu.Unlock()
		if n == 0 {
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	return code
}

type workerReply struct {
	PID        int      `json:"pid"`
	Gen        string   `json:"gen"`
	Tag        string   `json:"tag"`
	MapVersion string   `json:"map_version"`
	MapFile    string   `json:"map_file"`
	Map        string   `json:"map"`
	FDNames    []string `json:"fd_names"`
}

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
		Command:         testExe(t),
		Args:            []string{"__test-worker"},
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

func get(addr string) (workerReply, error) {
	var r workerReply
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
