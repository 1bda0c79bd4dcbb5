// Package sidecar is the router's HTTP API (cmd/router): routes for apps in
// any language, the map file, the status page and the fleet view, health
// and metrics; see docs/router-api.md. The routing itself is package router.
package sidecar

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/internal/version"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/zksession"
)

// The package's files: http.go the API's wiring, handlers.go the routing,
// map, readiness and fleet endpoints, json.go the routing answers' wire
// format, status.go the status page and its view, groups.go the Patroni
// groups, metrics.go the metrics.

// Limits of the HTTP API.
const (
	MaxUIDLen       = 1024    // bytes
	DefaultMaxBatch = 10000   // user ids per POST /v1/route
	maxBodyBytes    = 8 << 20 // a full batch of long uids fits
)

// HandlerOptions tune the sidecar's HTTP API.
type HandlerOptions struct {
	MaxBatch int
	// Registry receives the metrics (nil: a new one). /metrics serves it.
	Registry *prometheus.Registry
	// Fleet is the fleet status GET /v1/fleet shows, for a router that
	// follows ZooKeeper (nil: none); MemberID is the router's own member
	// record in it.
	Fleet    *fleet.Status
	MemberID string
	// Session, when set, is the router's ZooKeeper session: the sidecar
	// reads the Patroni groups among the db nodes through it (GET
	// /v1/groups, and "groups" in GET /v1/status).
	Session *zksession.Session
}

type handler struct {
	r           *router.Router
	maxBatch    int
	reg         *prometheus.Registry
	fleetStatus *fleet.Status
	memberID    string
	mux         *http.ServeMux
	groupCache  *groupCache
	poolCache   *poolCache

	routeMetrics
}

// Handler is the sidecar's HTTP API; see docs/router-api.md.
func Handler(r *router.Router, opt HandlerOptions) http.Handler {
	if opt.MaxBatch <= 0 {
		opt.MaxBatch = DefaultMaxBatch
	}
	reg := opt.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.Collector())
	}
	h := &handler{r: r, maxBatch: opt.MaxBatch, reg: reg, mux: http.NewServeMux(), fleetStatus: opt.Fleet, memberID: opt.MemberID}
	if opt.Session != nil {
		h.groupCache = newGroupCache(opt.Session)
	}
	h.poolCache = newPoolCache()
	h.registerMetrics(reg)
	// Every endpoint but /v1/route (whose POST is a batch lookup) only
	// reads: other methods get 405 with Allow (they used to get 200).
	h.mux.HandleFunc("/v1/route", h.route)
	h.mux.Handle("/v1/map", readOnly(h.mapFile))
	h.mux.Handle("/v1/status", readOnly(h.status))
	h.mux.Handle("/v1/fleet", readOnly(h.fleet))
	h.mux.Handle("/v1/groups", readOnly(h.groups))
	h.mux.Handle("/healthz", readOnly(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) }))
	h.mux.Handle("/readyz", readOnly(h.readyz))
	h.mux.Handle("/metrics", readOnly(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP))
	page := readOnly(h.page)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/" {
			writeError(w, http.StatusNotFound, "no such endpoint "+strconv.Quote(req.URL.Path)+"; see /v1/route, /v1/map, /v1/status, /v1/fleet, /healthz, /readyz, /metrics")
			return
		}
		page(w, req)
	})
	return h
}

// readOnly answers 405 with Allow: GET, HEAD to every other method.
func readOnly(f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, "method "+req.Method+" not allowed on "+req.URL.Path+": use GET")
			return
		}
		f(w, req)
	}
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	b, _ := json.Marshal(errorAnswer{Error: msg})
	w.Write(append(b, '\n'))
}

func (h *handler) bad(w http.ResponseWriter, reason, msg string) {
	h.badRequests.WithLabelValues(reason).Inc()
	writeError(w, http.StatusBadRequest, msg)
}
