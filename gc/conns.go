package gc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
)

// connCache keeps one connection per node for a run; a node that failed
// once is not retried in the same run.
type connCache struct {
	connect func(ctx context.Context, n bucketmap.Node) (*pgx.Conn, error)
	m       *bucketmap.Map
	mu      sync.Mutex
	conns   map[bucketmap.NodeID]*pgx.Conn
	errs    map[bucketmap.NodeID]error
	fences  map[bucketmap.NodeID]*fence.Fence
	// fenceErrs: nodes whose fence could not be read (not retried).
	fenceErrs map[bucketmap.NodeID]error
}

func (c *connCache) get(ctx context.Context, id bucketmap.NodeID) (*pgx.Conn, error) {
	c.mu.Lock()
	if conn, ok := c.conns[id]; ok {
		c.mu.Unlock()
		return conn, nil
	}
	if err, ok := c.errs[id]; ok {
		c.mu.Unlock()
		return nil, err
	}
	n, ok := c.m.Node(id)
	c.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("node %s is not in the registry", id)
	}
	// Connect without the lock, so that several nodes connect at once.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := c.connect(cctx, n)
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.conns[id]; ok { // another goroutine won the race
		if conn != nil {
			conn.Close(context.Background())
		}
		return prev, nil
	}
	if err != nil {
		c.errs[id] = err
		return nil, err
	}
	c.conns[id] = conn
	return conn, nil
}

// dial connects to every node of the candidates at once (a connection
// costs an authentication round trip or three). Failures are remembered
// and reported by verifyFences.
func (c *connCache) dial(ctx context.Context, ranges []Range) {
	var wg sync.WaitGroup
	seen := map[bucketmap.NodeID]bool{}
	for _, r := range ranges {
		for _, id := range []bucketmap.NodeID{r.Node, r.Owner} {
			if !seen[id] {
				seen[id] = true
				wg.Add(1)
				go func() { defer wg.Done(); _, _ = c.get(ctx, id) }()
			}
		}
	}
	wg.Wait()
}

// fenceOf reads a node's fence once per run (nil: not installed); a
// failure is remembered too.
func (c *connCache) fenceOf(ctx context.Context, id bucketmap.NodeID, conn *pgx.Conn) (*fence.Fence, error) {
	c.mu.Lock()
	if c.fences == nil {
		c.fences = map[bucketmap.NodeID]*fence.Fence{}
	}
	f, ok := c.fences[id]
	ferr := c.fenceErrs[id]
	c.mu.Unlock()
	if ok || ferr != nil {
		return f, ferr
	}
	f, err := fence.Read(ctx, conn)
	if errors.Is(err, fence.ErrNotInstalled) {
		f, err = nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if c.fenceErrs == nil {
			c.fenceErrs = map[bucketmap.NodeID]error{}
		}
		c.fenceErrs[id] = err
		return nil, err
	}
	c.fences[id] = f
	return f, nil
}

// setFence remembers a node's fence, read by readNode.
func (c *connCache) setFence(id bucketmap.NodeID, f *fence.Fence) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fences == nil {
		c.fences = map[bucketmap.NodeID]*fence.Fence{}
	}
	c.fences[id] = f
}

func (c *connCache) close() {
	for _, conn := range c.conns {
		conn.Close(context.Background())
	}
}
