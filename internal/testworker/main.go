// Command testworker is the supervisor tests' worker: a real process that
// speaks the worker protocol (LISTEN_FDS, READY=1, WATCHDOG=1, map files)
// and misbehaves on request. It is built without -race, once per test
// run: a race-built test binary spawned as a worker costs about half a
// CPU-second per start, and the supervisor tests start a few hundred.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shardvisor/shardvisor/internal/testkit"
	"github.com/shardvisor/shardvisor/workerproto"
)

func main() { os.Exit(run()) }

// run is a systemd-style worker controlled by environment:
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
func run() int {
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
		rep := testkit.WorkerReply{PID: pid, Gen: os.Getenv("SHARDVISOR_GENERATION"), Tag: os.Getenv("TW_TAG"),
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
