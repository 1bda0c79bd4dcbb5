// Package sidecar is the router's HTTP API (cmd/router): routes for apps in
// any language, the map file, the status page and the fleet view, health
// and metrics; see docs/router-api.md. The routing itself is package router.
package sidecar

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/schema"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Limits of the HTTP API.
const (
	MaxUIDLen       = 1024    // bytes
	DefaultMaxBatch = 10000   // user ids per POST /v1/route
	maxBodyBytes    = 8 << 20 // a full batch of long uids fits
)

//go:embed status.html
var statusPage []byte

// statusPageCSP lets the status page run its own inline script (by hash)
// and fetch from this origin, and nothing else: no other script, no
// inline event handler, no image, frame or form. Values from records are
// put into the page as text; this is the second line of defence.
var statusPageCSP = func() string {
	_, rest, ok := bytes.Cut(statusPage, []byte("<script>"))
	script, _, ok2 := bytes.Cut(rest, []byte("</script>"))
	if !ok || !ok2 {
		panic("sidecar: status.html has no <script> element")
	}
	sum := sha256.Sum256(script)
	return "default-src 'none'; script-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; " +
		"style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

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

	lookups     prometheus.Counter
	batchUIDs   prometheus.Counter
	stale       prometheus.Counter
	suspended   prometheus.Counter
	moved       prometheus.Counter
	badRequests *prometheus.CounterVec
}

// Handler is the sidecar's HTTP API; see docs/router-api.md.
func Handler(r *router.Router, opt HandlerOptions) http.Handler {
	if opt.MaxBatch <= 0 {
		opt.MaxBatch = DefaultMaxBatch
	}
	reg := opt.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	h := &handler{r: r, maxBatch: opt.MaxBatch, reg: reg, mux: http.NewServeMux(), fleetStatus: opt.Fleet, memberID: opt.MemberID}
	if opt.Session != nil {
		h.groupCache = &groupCache{s: opt.Session}
	}
	ns := "shardvisor_router_"
	h.lookups = prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "lookups_total", Help: "User ids routed over HTTP (single and batch)."})
	h.batchUIDs = prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "batch_lookups_total", Help: "User ids routed through POST /v1/route."})
	h.stale = prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "stale_answers_total", Help: "Answers given while the ZooKeeper session was lost (marked stale)."})
	h.suspended = prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "suspended_answers_total", Help: "Answers given while the ZooKeeper session was suspended."})
	h.moved = prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "moved_answers_total", Help: "Answers that told a caller its map was stale and the bucket moved."})
	h.badRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "bad_requests_total", Help: "Requests refused with 400, by reason."}, []string{"reason"})
	reg.MustRegister(h.lookups, h.batchUIDs, h.stale, h.suspended, h.moved, h.badRequests,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: ns + "map_version", Help: "Version of the bucket map in use (0: none yet)."}, func() float64 {
			if m := r.Map(); m != nil {
				return float64(m.Version)
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: ns + "map_updates_total", Help: "Bucket map versions applied."}, func() float64 { return float64(r.Stats().MapUpdates.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: ns + "map_rejected_total", Help: "Bucket maps refused (missing, malformed, older); the last good map stays in use."}, func() float64 { return float64(r.Stats().MapRejected.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: ns + "zk_state", Help: "ZooKeeper session state: 0 lost, 1 suspended, 2 connected, 3 closed."}, func() float64 { return float64(r.ZKState()) }),
	)
	if h.fleetStatus != nil {
		reg.MustRegister(&schemaCollector{h: h, changes: prometheus.NewDesc(ns+"schema_changes", "Recorded schema changes by state (applied, partial, failed, pending), from the fleet view.", []string{"state"}, nil),
			drift: prometheus.NewDesc(ns+"schema_drift_differences", "Differences the last `shardctl schema diff` found (sharded tables, and changes a node lacks); -1 before any.", nil, nil)})
	}
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
	page := readOnly(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", statusPageCSP)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Write(statusPage)
	})
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
	b, _ := json.Marshal(map[string]string{"error": msg})
	w.Write(append(b, '\n'))
}

func (h *handler) bad(w http.ResponseWriter, reason, msg string) {
	h.badRequests.WithLabelValues(reason).Inc()
	writeError(w, http.StatusBadRequest, msg)
}

// checkUID says what is wrong with a user id, or "".
func checkUID(uid string) (reason, msg string) {
	switch {
	case uid == "":
		return "missing_uid", "uid is missing or empty"
	case len(uid) > MaxUIDLen:
		return "uid_too_long", fmt.Sprintf("uid is %d bytes; the limit is %d", len(uid), MaxUIDLen)
	case !utf8.ValidString(uid):
		return "uid_not_utf8", "uid is not valid UTF-8"
	}
	return "", ""
}

// validJSONText reports whether JSON text is valid UTF-8 and every \u
// escape in it is a character: a surrogate only as a high-low pair.
// (Outside strings JSON has no backslash, so escapes are found by
// scanning the whole text.)
func validJSONText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		i++
		if i >= len(b) || b[i] != 'u' {
			continue // \" \\ \/ \n ...: one character, skipped
		}
		r, ok := hex4(b[i+1:])
		if !ok {
			return false
		}
		i += 4
		switch {
		case r >= 0xDC00 && r < 0xE000:
			return false // a low surrogate alone
		case r >= 0xD800 && r < 0xDC00:
			if i+6 >= len(b) || b[i+1] != '\\' || b[i+2] != 'u' {
				return false
			}
			if lo, ok := hex4(b[i+3:]); !ok || lo < 0xDC00 || lo >= 0xE000 {
				return false
			}
			i += 6
		}
	}
	return true
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

var (
	bufPool    = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}
	routesPool = sync.Pool{New: func() any { var rs []router.Route; return &rs }}
)

func (h *handler) count(rt router.Route) {
	switch {
	case rt.Stale:
		h.stale.Inc()
	case rt.Suspended:
		h.suspended.Inc()
	}
	if rt.Moved {
		h.moved.Inc()
	}
}

func (h *handler) route(w http.ResponseWriter, req *http.Request) {
	switch req.Method {
	case http.MethodGet, http.MethodHead:
		h.routeOne(w, req)
	case http.MethodPost:
		h.routeBatch(w, req)
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		writeError(w, http.StatusMethodNotAllowed, "use GET /v1/route?uid=... or POST /v1/route with {\"uids\": [...]}")
	}
}

func parseVersion(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("map_version %q is not a non-negative integer", s)
	}
	return v, nil
}

func (h *handler) routeOne(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	uids := q["uid"]
	if len(uids) > 1 {
		h.bad(w, "many_uids", "give one uid per GET, or POST a batch")
		return
	}
	uid := ""
	if len(uids) == 1 {
		uid = uids[0]
	}
	if reason, msg := checkUID(uid); reason != "" {
		h.bad(w, reason, msg)
		return
	}
	used, err := parseVersion(q.Get("map_version"))
	if err != nil {
		h.bad(w, "bad_map_version", err.Error())
		return
	}
	rt, err := h.r.RouteAt(uid, used)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	h.lookups.Inc()
	h.count(rt)
	bp := bufPool.Get().(*[]byte)
	b := appendRoute((*bp)[:0], uid, rt)
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
	*bp = b
	bufPool.Put(bp)
}

type batchRequest struct {
	UIDs       []string `json:"uids"`
	MapVersion uint64   `json:"map_version"`
}

func (h *handler) routeBatch(w http.ResponseWriter, req *http.Request) {
	data, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			h.bad(w, "body_too_large", fmt.Sprintf("request body over %d bytes", maxBodyBytes))
			return
		}
		h.bad(w, "bad_body", "reading the request body: "+err.Error())
		return
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var br batchRequest
	if err := dec.Decode(&br); err != nil {
		h.bad(w, "bad_json", "bad JSON: "+err.Error()+`; want {"uids": ["..."], "map_version": N}`)
		return
	}
	if _, err := dec.Token(); err != io.EOF {
		h.bad(w, "bad_json", "bad JSON: trailing data after the object")
		return
	}
	// encoding/json turns invalid UTF-8 and lone surrogate escapes into
	// U+FFFD, which would route some other user: refuse them, as GET does.
	if !validJSONText(data) {
		var raw struct{ UIDs []json.RawMessage }
		_ = json.Unmarshal(data, &raw)
		for i, u := range raw.UIDs {
			if !validJSONText(u) {
				h.bad(w, "uid_not_utf8", fmt.Sprintf("uids[%d]: uid is not valid UTF-8", i))
				return
			}
		}
		h.bad(w, "bad_json", "bad JSON: the body is not valid UTF-8")
		return
	}
	if len(br.UIDs) == 0 {
		h.bad(w, "missing_uid", `"uids" is missing or empty`)
		return
	}
	if len(br.UIDs) > h.maxBatch {
		h.bad(w, "batch_too_large", fmt.Sprintf("%d uids in one batch; the limit is %d", len(br.UIDs), h.maxBatch))
		return
	}
	for i, uid := range br.UIDs {
		if reason, msg := checkUID(uid); reason != "" {
			h.bad(w, reason, fmt.Sprintf("uids[%d]: %s", i, msg))
			return
		}
	}
	// One map version for the whole batch, so every answer has the same map.
	rp := routesPool.Get().(*[]router.Route)
	defer routesPool.Put(rp)
	version, routes, err := h.r.RouteBatch((*rp)[:0], br.UIDs, br.MapVersion)
	*rp = routes
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	b := make([]byte, 0, 64+len(br.UIDs)*160)
	b = append(b, `{"map_version":`...)
	b = strconv.AppendUint(b, version, 10)
	b = append(b, `,"routes":[`...)
	for i, rt := range routes {
		h.count(rt)
		if i > 0 {
			b = append(b, ',')
		}
		b = appendRoute(b, br.UIDs[i], rt)
	}
	b = append(b, "]}\n"...)
	h.lookups.Add(float64(len(br.UIDs)))
	h.batchUIDs.Add(float64(len(br.UIDs)))
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// JSONRoute is a route as the API writes it, for callers that encode it
// themselves (shardctl route --json).
func JSONRoute(uid string, rt router.Route) json.RawMessage { return appendRoute(nil, uid, rt) }

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string. (strconv.AppendQuote writes
// Go escapes such as \x00, which are not JSON.)
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendRoute writes a route as JSON without reflection: this is the
// sidecar's hot path.
func appendRoute(b []byte, uid string, rt router.Route) []byte {
	b = append(b, `{"uid":`...)
	b = appendJSONString(b, uid)
	b = append(b, `,"bucket":`...)
	b = strconv.AppendUint(b, uint64(rt.Bucket), 10)
	b = append(b, `,"level":`...)
	b = strconv.AppendInt(b, int64(rt.Level), 10)
	b = append(b, `,"node":`...)
	b = appendJSONString(b, string(rt.Node))
	b = append(b, `,"dsn":`...)
	b = appendJSONString(b, rt.DSN)
	if rt.Group != "" {
		b = append(b, `,"group":`...)
		b = appendJSONString(b, rt.Group)
	}
	b = append(b, `,"map_version":`...)
	b = strconv.AppendUint(b, rt.MapVersion, 10)
	b = append(b, `,"state":`...)
	b = appendJSONString(b, string(rt.State))
	if rt.Target != "" {
		b = append(b, `,"target":`...)
		b = appendJSONString(b, string(rt.Target))
	}
	b = append(b, `,"data_lost":`...)
	b = strconv.AppendBool(b, rt.DataLost)
	b = append(b, `,"suspended":`...)
	b = strconv.AppendBool(b, rt.Suspended)
	b = append(b, `,"stale":`...)
	b = strconv.AppendBool(b, rt.Stale)
	b = append(b, `,"moved":`...)
	b = strconv.AppendBool(b, rt.Moved)
	if rt.Moved {
		b = append(b, `,"moved_from":`...)
		b = appendJSONString(b, string(rt.MovedFrom))
	}
	return append(b, '}')
}

func (h *handler) mapFile(w http.ResponseWriter, req *http.Request) {
	data, etag, err := h.r.MapFile()
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	w.Header().Set("ETag", etag)
	w.Header().Set("Cache-Control", "no-cache")
	if match := req.Header.Get("If-None-Match"); match != "" && (match == etag || match == "*") {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(data)
}

func (h *handler) readyz(w http.ResponseWriter, _ *http.Request) {
	m := h.r.Map()
	if m == nil {
		writeError(w, http.StatusServiceUnavailable, "not ready: "+router.ErrNotReady.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"ready\":true,\"map_version\":%d,\"zk_state\":%q,\"source\":%q}\n", m.Version, h.r.ZKState(), h.r.Source())
}

// StatusView is what the status page shows (GET /v1/status).
type StatusView struct {
	Cluster    string                  `json:"cluster"`
	Source     router.Source           `json:"source"`
	ZKState    string                  `json:"zk_state"`
	MapVersion uint64                  `json:"map_version"`
	Level      int                     `json:"level"` // the deepest bucket's depth; every bucket's at one depth
	MinDepth   int                     `json:"min_depth"`
	Buckets    int                     `json:"buckets"`
	AppliedAt  time.Time               `json:"applied_at"`
	Nodes      []bucketmap.NodeSummary `json:"nodes"`
	// Cells is the grid: one per bucket in key order, or per run of
	// PerCell buckets when there are more than maxCells. Each is [owner
	// index, moving buckets, data-lost buckets], owner being the
	// majority owner; Labels names each cell's buckets as shardctl does
	// ("5", "4-7", at mixed depths "0/3" or "0/3-1/2").
	PerCell  int                       `json:"per_cell"`
	Cells    [][3]int                  `json:"cells"`
	Labels   []string                  `json:"labels"`
	InFlight []bucketmap.BucketSummary `json:"in_flight"`
	Balanced bool                      `json:"balanced"`
	Error    string                    `json:"last_error,omitempty"`
	// Groups are the Patroni groups among the nodes, as their records
	// say now (the sidecar's handler fills it; Status leaves it empty).
	Groups map[bucketmap.NodeID]*GroupView `json:"groups,omitempty"`
}

const maxCells = 1024

// Status builds the status page's data from r's map.
func Status(r *router.Router) (*StatusView, error) {
	applied := r.Applied()
	if len(applied) == 0 {
		return nil, router.ErrNotReady
	}
	cur := applied[len(applied)-1]
	m, cluster, at := cur.Map, cur.Cluster, cur.At
	sum := m.Summarize()
	v := &StatusView{Cluster: cluster, Source: r.Source(), ZKState: r.ZKState().String(), MapVersion: m.Version, Level: m.Level, MinDepth: m.MinDepth(),
		Buckets: m.Buckets(), AppliedAt: at, Nodes: sum.Nodes, Balanced: sum.Balanced, InFlight: []bucketmap.BucketSummary{}}
	if e := r.Stats().LastError.Load(); e != nil {
		v.Error = *e
	}
	// The flagged buckets are the only ones that are moving or lost.
	flagged := make(map[bucketmap.Bucket]bucketmap.BucketSummary, len(sum.Flagged))
	for _, b := range sum.Flagged {
		flagged[b.Bucket] = b
		if b.State == bucketmap.BucketMoving {
			v.InFlight = append(v.InFlight, b)
		}
	}
	units := m.BucketList()
	v.PerCell = max(1, (len(units)+maxCells-1)/maxCells)
	counts := make([]int, len(m.Nodes()))
	for lo := 0; lo < len(units); lo += v.PerCell {
		clear(counts)
		moving, lost := 0, 0
		hi := min(lo+v.PerCell, len(units)) - 1
		label := m.Name(units[lo])
		if hi > lo {
			label += "-" + m.Name(units[hi])
		}
		v.Labels = append(v.Labels, label)
		for _, b := range units[lo : hi+1] {
			slot, _ := m.SlotsOf(b)
			counts[m.OwnerIndex(slot)]++
			if bm, ok := flagged[b]; ok {
				if bm.State == bucketmap.BucketMoving {
					moving++
				}
				if bm.DataLost {
					lost++
				}
			}
		}
		best := 0
		for i, c := range counts {
			if c > counts[best] {
				best = i
			}
		}
		v.Cells = append(v.Cells, [3]int{best, moving, lost})
	}
	return v, nil
}

func (h *handler) status(w http.ResponseWriter, _ *http.Request) {
	v, err := Status(h.r)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	v.Groups = h.groupCache.get(h.r.Map())
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// fleet serves the fleet view: always 200 with JSON; "available" false
// says why there is none.
func (h *handler) fleet(w http.ResponseWriter, req *http.Request) {
	v := h.fleetView(req.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	json.NewEncoder(w).Encode(v)
}

// fleetView is the fleet status seen from this router: its map, its
// session's state and the maps it keeps, which date the stragglers.
func (h *handler) fleetView(ctx context.Context) *fleet.View {
	r := h.r
	self := fleet.Self{ID: h.memberID, Source: string(r.Source()), ZKState: r.ZKState().String()}
	applied := r.Applied()
	cluster := ""
	known := make([]fleet.KnownMap, 0, len(applied))
	for _, a := range applied {
		written := a.Map.UpdatedAt
		if written.IsZero() {
			written = a.At
		}
		known = append(known, fleet.KnownMap{Version: a.Map.Version, Written: written.UTC()})
	}
	if n := len(applied); n > 0 {
		cur := applied[n-1]
		cluster = cur.Cluster
		self.MapVersion, self.MapUpdatedAt, self.AppliedAt = cur.Map.Version, cur.Map.UpdatedAt.UTC(), cur.At.UTC()
		self.SchemaNodes = schema.Required(cur.Map)
	}
	if r.Source() != router.SourceZooKeeper {
		self.ZKState = ""
		return fleet.Unavailable(self, cluster, "no fleet view: router runs from a map file")
	}
	if h.fleetStatus == nil {
		return fleet.Unavailable(self, cluster, "no fleet view: the sidecar was not given a fleet status")
	}
	return h.fleetStatus.View(ctx, self, r.ZKState() == zksession.StateConnected, known)
}

// schemaCollector exports the schema history's states and the last drift
// check from the fleet view (cached by fleet.Status: a scrape does not
// read ZooKeeper more often than the view's refresh allows).
type schemaCollector struct {
	h              *handler
	changes, drift *prometheus.Desc
}

func (c *schemaCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.changes; ch <- c.drift }

func (c *schemaCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v := c.h.fleetView(ctx)
	if !v.Available {
		return
	}
	for _, st := range []string{topo.SchemaApplied, topo.SchemaPartial, topo.SchemaFailed, topo.SchemaPending} {
		ch <- prometheus.MustNewConstMetric(c.changes, prometheus.GaugeValue, float64(v.Schema.ByState[st]), st)
	}
	d := -1.0
	if v.Schema.Drift != nil {
		d = float64(v.Schema.Drift.Count)
	}
	ch <- prometheus.MustNewConstMetric(c.drift, prometheus.GaugeValue, d)
}
