package supervisor

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// LivenessStale is how long the supervisor's loop may go without a turn
// before /livez fails (it turns at least every second).
const LivenessStale = 10 * time.Second

// startAdmin serves /healthz, /readyz, /livez, /metrics and /status.
//
//   - /healthz is what a load balancer probes: 200 while the pool is in
//     service (listen sockets open, session fine or fail-static) and at
//     least one worker is ready; 503 otherwise, so a host whose workers
//     all crashed is taken out instead of queueing connections in the
//     backlog. It does not flap during a swap (the old generation stays
//     ready until the new one is).
//   - /readyz is 200 when, in addition, the whole target is ready: for
//     deploy tooling waiting for a host to be complete, not for a load
//     balancer (one crashed worker of ten would take the host out).
//   - /livez is 200 while the supervisor's own loop turns: for a process
//     watchdog; it says nothing about the workers.
//   - /status is the member record as JSON, plus the last swap result.
//   - /peer/zk answers the peers' fail-static question (peers.go).
//
// Every endpoint answers GET and HEAD only; other methods get 405.
//
// In fail-static (failstatic.go) /healthz and /readyz stay 200 (given
// ready workers), and say so: "fail_static": true and the reason.
func (s *Supervisor) startAdmin() error {
	if s.opts.AdminAddr == "" {
		return nil
	}
	ln, err := s.adminListener() // upgrade.go: an upgrade hands it over
	if err != nil || ln == nil {
		return err
	}
	s.serveAdmin(ln)
	return nil
}

// serveAdmin serves the admin endpoints on ln.
func (s *Supervisor) serveAdmin(ln net.Listener) {
	s.snapMu.Lock()
	s.admin = ln.Addr().String()
	s.snapMu.Unlock()
	mux := http.NewServeMux()
	health := func(needAll bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			s.snapMu.Lock()
			h, state, target := s.health, s.snap.State, s.snap.Target
			s.snapMu.Unlock()
			ok := h.serving
			if needAll {
				ok = h.ready
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			if !ok {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"ok": ok, "state": state, "accepting": h.accepting, "serving": h.serving,
				"ready": h.ready, "ready_workers": h.readyN, "target_workers": target, "fail_static": h.failStatic, "reason": h.reason})
		}
	}
	mux.HandleFunc("/livez", func(w http.ResponseWriter, r *http.Request) {
		age := time.Since(time.Unix(0, s.loopAt.Load()))
		ok := s.loopAt.Load() != 0 && age < LivenessStale
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": ok, "loop_age_seconds": age.Seconds()})
	})
	mux.HandleFunc(peerPath, s.servePeer)
	mux.HandleFunc("/healthz", health(false))
	mux.HandleFunc("/readyz", health(true))
	mux.Handle("/metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		s.snapMu.Lock()
		body := map[string]any{"member": s.snap, "last_swap": s.lastStatus}
		s.snapMu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(body)
	})
	if s.opts.AdminTLS != nil {
		// The tracked listener counts the TLS connections: the raw
		// listener stays the one an upgrade hands over.
		ln = tls.NewListener(ln, s.opts.AdminTLS)
	}
	tl := &trackedListener{Listener: ln}
	s.adminLn = tl
	s.http = &http.Server{Handler: readOnly(mux), ReadHeaderTimeout: 5 * time.Second, ConnState: func(c net.Conn, st http.ConnState) {
		if st == http.StateClosed || st == http.StateHijacked {
			tl.open.Add(-1)
		}
	}}
	s.adminServed = make(chan struct{})
	go func() {
		defer close(s.adminServed)
		if err := s.http.Serve(tl); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.log.Error("admin server failed", zap.Error(err))
		}
	}()
}

// readOnly answers 405 to every method but GET and HEAD: every admin
// endpoint only reads, and a POST or DELETE answered 200 would let a
// client (or a misdirected script) believe it changed something. An
// endpoint that acts would need its own method check here.
func readOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method "+r.Method+" not allowed: the admin endpoints are read-only (GET, HEAD)", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// stopAdmin stops accepting and answers every connection already
// accepted before it returns (at most 2 s). http.Server.Shutdown is not
// used: a request it reads after it began is dropped unanswered (net/http
// closes the connection), and an upgrade's hand-over did exactly that to a
// load balancer's health check accepted in that instant (EOF). Instead the
// listener closes (the socket stays open in the other supervisor of an
// upgrade, which accepts from then on), keep-alives end so each accepted
// connection closes after its answer, and the listener's count of open
// connections says when all are answered.
//
// The count is read only once Serve has returned. Closing the listener
// does not stop an accept already in its system call: it can still hand
// Serve a connection after Close, one not counted yet. Reading the count
// at once found 0, and http.Server.Close then closed that connection
// unanswered (CI: a health check saw EOF during an upgrade's hand-over).
// Once Serve has returned, its last Accept has too, and counted what it
// took. http.Server.Close runs only if something is still open at the
// bound.
func (s *Supervisor) stopAdmin() {
	if s.http == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.http.SetKeepAlivesEnabled(false)
	_ = s.adminLn.Close()
	select {
	case <-s.adminServed:
	case <-ctx.Done():
	}
	for s.adminLn.open.Load() > 0 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if s.adminLn.open.Load() > 0 || ctx.Err() != nil {
		_ = s.http.Close()
	}
}

// trackedListener counts the connections it accepted that are not closed
// yet (the server's ConnState hook counts them down).
type trackedListener struct {
	net.Listener
	open atomic.Int64
}

func (l *trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.open.Add(1)
	}
	return c, err
}
