package sidecar

import (
	"sync"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
)

// nodeCache is a view of some of the map's nodes read from elsewhere
// (Patroni's records, the poolers' admin consoles), read at most once per
// maxAge for every client of the sidecar together, so 50 status pages and
// scrapes cost what one does. A view older than maxAge is read again in
// the background, once for all callers, and served stale meanwhile; only
// the first caller, with no view at all, waits for the read (at most
// 3 s). So a slow source makes the view stale, never a status page slow.
type nodeCache[V any] struct {
	maxAge     time.Duration
	read       func(m *bucketmap.Map) map[bucketmap.NodeID]*V
	mu         sync.Mutex
	at         time.Time
	v          map[bucketmap.NodeID]*V
	refreshing chan struct{} // closed when the read in flight ends
}

func (c *nodeCache[V]) get(m *bucketmap.Map) map[bucketmap.NodeID]*V {
	if c == nil || c.read == nil || m == nil {
		return nil
	}
	c.mu.Lock()
	v := c.v
	if v != nil && time.Since(c.at) < c.maxAge {
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

func (c *nodeCache[V]) refresh(m *bucketmap.Map, done chan struct{}) {
	out := c.read(m)
	c.mu.Lock()
	c.at, c.v, c.refreshing = time.Now(), out, nil
	c.mu.Unlock()
	close(done)
}
