// Package worker is the Go side of the supervisor's protocol, for workers
// written in Go: take the listening socket the supervisor passed
// (LISTEN_FDS), say READY=1 once serving (NOTIFY_SOCKET), answer the
// watchdog, and drain on SIGTERM without dropping a request. Workers in
// other languages use their own systemd-aware servers unchanged.
package worker

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shardvisor/shardvisor/workerproto"
)

// Listener returns the first socket passed by the supervisor (fd 3; the
// probe socket does not count), or, when run by hand, a new listener on
// fallback.
func Listener(fallback string) (net.Listener, error) {
	if n, names := workerproto.ListenFDs(); n > 0 {
		for i := 0; i < n; i++ {
			name := ""
			if i < len(names) {
				name = names[i]
			}
			if name == workerproto.ProbeFDName {
				continue
			}
			f := os.NewFile(uintptr(workerproto.FirstListenFD+i), name)
			defer f.Close() // FileListener dups it
			return net.FileListener(f)
		}
	}
	if fallback == "" {
		return nil, errors.New("no LISTEN_FDS from a supervisor and no address to listen on")
	}
	return net.Listen("tcp", fallback)
}

// Notify sends sd_notify(3) state to NOTIFY_SOCKET, if set
// (workerproto.Notify without its "sent" flag).
func Notify(state string) error {
	_, err := workerproto.Notify(state)
	return err
}

// watchdog sends WATCHDOG=1 at half the interval the supervisor asked for.
// The supervisor always sets WATCHDOG_PID, so it is required here.
func watchdog(ctx context.Context) {
	d := workerproto.WatchdogInterval(true)
	if d <= 0 {
		return
	}
	t := time.NewTicker(d / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = Notify(workerproto.Watchdog)
		}
	}
}

// reportRequests tells the supervisor how many requests this worker has
// served (REQUESTS=N, cumulative), at most every "every" and only when
// the count changed, until ctx ends: the supervisor recycles the worker
// at the pool's max_requests.
func reportRequests(ctx context.Context, n *atomic.Uint64, every time.Duration) {
	if os.Getenv(workerproto.EnvNotifySocket) == "" {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var sent uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if v := n.Load(); v != sent {
			if Notify(workerproto.RequestsReport(v)) == nil {
				sent = v
			}
		}
	}
}

// probeListener is the supervisor's probe socket, if it passed one.
func probeListener() net.Listener {
	n, names := workerproto.ListenFDs()
	for i := 0; i < n && i < len(names); i++ {
		if names[i] == workerproto.ProbeFDName {
			f := os.NewFile(uintptr(workerproto.FirstListenFD+i), names[i])
			defer f.Close()
			ln, err := net.FileListener(f)
			if err != nil {
				return nil
			}
			return ln
		}
	}
	return nil
}

// Linger is how long a draining worker keeps answering on connections it
// already has (each answer closing its connection) before it closes the
// idle ones.
var Linger = 500 * time.Millisecond

// Serve runs srv on ln until SIGTERM or SIGINT, then drains: it stops
// accepting, lets connections already accepted deliver their request,
// and waits (up to drain) for every request in flight. It sends READY=1
// once serving and STOPPING=1 when the drain starts.
//
// net/http's Shutdown alone would drop connections that were accepted but
// whose first request had not been read yet; under the supervisor the
// socket stays open for the other workers, so nothing else would serve
// them.
func Serve(srv *http.Server, ln net.Listener, drain time.Duration) error {
	var mu sync.Mutex
	fresh := map[net.Conn]bool{} // accepted, first request not read yet
	prev := srv.ConnState
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		mu.Lock()
		if st == http.StateNew {
			fresh[c] = true
		} else {
			delete(fresh, c)
		}
		mu.Unlock()
		if prev != nil {
			prev(c, st)
		}
	}
	// While draining, every response says Connection: close, so that
	// clients with idle keep-alive connections retire them instead of
	// sending a request just as the connection is closed (HTTP/1.1 clients
	// do not retry a POST that hit a closing idle connection).
	var draining atomic.Bool
	// The supervisor's HTTP probe (a pool config's "probe") comes on a
	// socket of this worker's own: answer it with the same handler, so it
	// sees what clients see.
	probe := probeListener()
	var probeAddr string
	if probe != nil {
		probeAddr = probe.Addr().String()
	}
	// Every request but the probe's counts towards the pool's
	// max_requests (reported by reportRequests).
	var requests atomic.Uint64
	h := srv.Handler
	if h == nil {
		h = http.DefaultServeMux
	}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if draining.Load() {
			w.Header().Set("Connection", "close")
		}
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); !ok || probeAddr == "" || a.String() != probeAddr {
			requests.Add(1)
		}
		h.ServeHTTP(w, r)
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if probe != nil {
		go func() { _ = srv.Serve(probe) }()
	}
	go watchdog(ctx)
	go reportRequests(ctx, &requests, workerproto.RequestsReportEvery)
	_ = Notify(workerproto.Ready)
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	_ = Notify(workerproto.Stopping)
	draining.Store(true)
	ln.Close()
	if probe != nil {
		probe.Close()
	}
	<-served // every accepted connection is registered now
	// Serve the connections already open for a moment with
	// Connection: close, so busy clients move to the new workers cleanly.
	time.Sleep(min(Linger, drain/2))
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		mu.Lock()
		n := len(fresh)
		mu.Unlock()
		if n == 0 {
			break
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	return srv.Shutdown(sctx)
}

// FollowMap keeps a worker's map current in the supervisor's reload mode
// (SHARDVISOR_MAP_DELIVERY=reload): on a goroutine, until ctx ends, it
// calls load with the contents of SHARDVISOR_MAP_FILE each time the
// supervisor replaces it, and acknowledges the version load returns with
// MAPVERSION=N (current, the version already loaded, at once). It returns
// false, starting nothing, when the worker is not in reload mode: there
// every map comes with a new worker. Workers that route with the router
// package need none of this: router.FromWorkerEnv follows the file itself.
func FollowMap(ctx context.Context, current uint64, load func(data []byte) (uint64, error), onErr func(error)) bool {
	f, ok := workerproto.MapFollowFromEnv()
	if !ok || !f.Reload {
		return false
	}
	go workerproto.FollowMapFile(ctx, f, current, load, onErr)
	return true
}
