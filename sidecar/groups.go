package sidecar

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// GroupView is one Patroni group as GET /v1/groups and the status page
// show it: Patroni's records read now (its primary, each member's role,
// state, timeline and lag, the synchronous standby) and what is wrong.
type GroupView = topo.PatroniView

// groupsMaxAge bounds how old a group view may be: the records are read
// at most once per this for every client of the sidecar together.
const groupsMaxAge = time.Second

type groupCache = nodeCache[GroupView]

// newGroupCache reads the groups among the map's nodes through s.
func newGroupCache(s *zksession.Session) *groupCache {
	return &groupCache{maxAge: groupsMaxAge, read: func(m *bucketmap.Map) map[bucketmap.NodeID]*GroupView {
		out := map[bucketmap.NodeID]*GroupView{}
		for _, n := range m.Nodes() {
			if n.Patroni.IsZero() || n.State == bucketmap.NodeRemoved {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			v := topo.ReadPatroniView(ctx, s, n.Patroni.Namespace, n.Patroni.Scope)
			cancel()
			// Each member's Patroni REST API is often unauthenticated: the
			// sidecar's clients (the apps) have no use for its address.
			for i := range v.Members {
				v.Members[i].APIURL = ""
			}
			out[n.ID] = v
		}
		return out
	}}
}

// groups serves GET /v1/groups: {"groups": {node: GroupView}}, empty
// when no node is a group or the router has no ZooKeeper session (a map
// file: the DSN in each route still reaches the primary).
func (h *handler) groups(w http.ResponseWriter, req *http.Request) {
	m := h.r.Map()
	if m == nil {
		writeError(w, http.StatusServiceUnavailable, router.ErrNotReady.Error())
		return
	}
	v := h.groupCache.get(m)
	if v == nil {
		v = map[bucketmap.NodeID]*GroupView{}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(map[string]any{"groups": v})
}
