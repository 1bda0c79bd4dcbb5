package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// startAdmin serves /healthz, /readyz, /metrics and /status.
//
//   - /healthz is 200 while the listen sockets are open (the pool is in
//     service), 503 otherwise: ZooKeeper session lost, holddown, stopping,
//     or not started yet. Load balancers should check this.
//   - /readyz is 200 when, in addition, at least the target number of
//     workers are ready.
//   - /status is the member record as JSON, plus the last swap result.
//   - /peer/zk answers the peers' fail-static question (peers.go).
//
// In fail-static (failstatic.go) /healthz and /readyz stay 200, and say
// so: "fail_static": true and the reason.
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
	health := func(needReady bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			s.snapMu.Lock()
			h, state := s.health, s.snap.State
			s.snapMu.Unlock()
			ok := h.accepting
			if needReady {
				ok = h.ready
			}
			w.Header().Set("Content-Type", "application/json")
			if !ok {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"ok": ok, "state": state, "accepting": h.accepting, "ready": h.ready, "fail_static": h.failStatic, "reason": h.reason})
		}
	}
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
	s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin server failed", zap.Error(err))
		}
	}()
}

func (s *Supervisor) stopAdmin() {
	if s.http == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.http.Shutdown(ctx)
}
