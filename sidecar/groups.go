package sidecar

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
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
// at most once per this for every client of the sidecar together, so 50
// status pages cost Patroni's records no more than one.
const groupsMaxAge = time.Second

type groupCache struct {
	s          *zksession.Session
	mu         sync.Mutex
	at         time.Time
	v          map[bucketmap.NodeID]*GroupView
	refreshing chan struct{} // closed when the read in flight ends
}

// get returns the groups of m's nodes. A view older than groupsMaxAge is
// read again in the background, once for all callers, and served stale
// meanwhile; only the first caller, with no view at all, waits for the
// read (at most 3 s). So a slow ensemble makes the view stale, never a
// status page slow.
func (c *groupCache) get(m *bucketmap.Map) map[bucketmap.NodeID]*GroupView {
	if c == nil || c.s == nil || m == nil {
		return nil
	}
	c.mu.Lock()
	v := c.v
	if v != nil && time.Since(c.at) < groupsMaxAge {
		c.mu.Unlock()
		return v
	}
	done := c.refreshing
	if done == nil {
		done = make(chan struct{})
		c.refreshing = done
		go c.refresh(m, done)
	}
	c.mu.Unlock()
	if v != nil {
		return v
	}
	select {
	case <-done:
	case <-time.After(3 * time.Second):
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.v
}

func (c *groupCache) refresh(m *bucketmap.Map, done chan struct{}) {
	out := map[bucketmap.NodeID]*GroupView{}
	for _, n := range m.Nodes() {
		if n.Patroni.IsZero() || n.State == bucketmap.NodeRemoved {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		v := topo.ReadPatroniView(ctx, c.s, n.Patroni.Namespace, n.Patroni.Scope)
		cancel()
		// Each member's Patroni REST API is often unauthenticated: the
		// sidecar's clients (the apps) have no use for its address.
		for i := range v.Members {
			v.Members[i].APIURL = ""
		}
		out[n.ID] = v
	}
	c.mu.Lock()
	c.at, c.v, c.refreshing = time.Now(), out, nil
	c.mu.Unlock()
	close(done)
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
