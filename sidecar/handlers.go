package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/schema"
	"github.com/shardvisor/shardvisor/zksession"
)

// The API's handlers but the status page's (status.go) and the groups'
// (groups.go).

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

var (
	bufPool    = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}
	routesPool = sync.Pool{New: func() any { var rs []router.Route; return &rs }}
)

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
	for _, rt := range routes {
		h.count(rt)
	}
	b := appendBatch(make([]byte, 0, 64+len(br.UIDs)*160), version, br.UIDs, routes)
	b = append(b, '\n')
	h.lookups.Add(float64(len(br.UIDs)))
	h.batchUIDs.Add(float64(len(br.UIDs)))
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
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
	json.NewEncoder(w).Encode(readyAnswer{Ready: true, MapVersion: m.Version, ZKState: h.r.ZKState().String(), Source: h.r.Source()})
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
