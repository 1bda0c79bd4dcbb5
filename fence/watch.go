package fence

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/topo"
)

// Defaults of WatchOptions.
const (
	// DefaultWatchRetry is how soon a node that could not be brought in
	// step (down, unreachable, failed) is tried again: with a node that
	// refuses connections while it is down, the bound on how long it
	// accepts writes for buckets it lost after it comes back.
	DefaultWatchRetry = time.Second
	// DefaultWatchEvery is how often a node in step is synced again, to
	// repair drift nobody announced (an edited fence, a restored backup).
	DefaultWatchEvery = 30 * time.Second
	// DefaultWatchTimeout bounds one sync of one node (connect and flip).
	DefaultWatchTimeout = 5 * time.Second
)

// WatchOptions tune Watch.
type WatchOptions struct {
	Retry   time.Duration // 0: DefaultWatchRetry
	Every   time.Duration // 0: DefaultWatchEvery
	Timeout time.Duration // 0: DefaultWatchTimeout
	Logger  *zap.Logger   // nil: no logs
	// Report, if set, is called (from Watch's goroutine) with every
	// outcome that differs from the node's previous one, and every repair.
	Report func(m *bucketmap.Map, r NodeSync)
	// Metrics, if set, records every outcome (NewWatchMetrics).
	Metrics *WatchMetrics
}

// Watch is the continuous fence reconciler: it follows the bucket map and
// keeps the fence of every node of the registry (or of ids), down nodes
// included, in step with the newest map, until ctx ends. Each node is
// synced on its own (a node that hangs holds up no other): at once when
// the map changes, again every opt.Retry while it cannot be brought in
// step, and every opt.Every while it is. So a node marked down while it
// was unreachable has its lost buckets revoked within opt.Retry plus one
// sync of answering again (opt.Retry plus opt.Timeout if its last attempt
// hung), with nobody doing anything. Removed nodes are left out unless
// named in ids. Syncs never go back in time (ErrStale), so any number of
// watchers, and the map commands' own syncs, may run at once.
func Watch(ctx context.Context, st *bucketmap.Store, ids []bucketmap.NodeID, opt WatchOptions) error {
	if opt.Retry <= 0 {
		opt.Retry = DefaultWatchRetry
	}
	if opt.Every <= 0 {
		opt.Every = DefaultWatchEvery
	}
	if opt.Timeout <= 0 {
		opt.Timeout = DefaultWatchTimeout
	}
	log := opt.Logger
	if log == nil {
		log = zap.NewNop()
	}
	mapW := topo.WatchMap(ctx, st.Session(), st.Paths())
	defer mapW.Stop()

	type outcome struct {
		r       NodeSync
		version uint64
	}
	type nodeState struct {
		next    time.Time
		running bool
		last    string
	}
	results := make(chan outcome)
	nodes := map[bucketmap.NodeID]*nodeState{}
	state := func(id bucketmap.NodeID) *nodeState {
		s := nodes[id]
		if s == nil {
			s = &nodeState{}
			nodes[id] = s
		}
		return s
	}
	targets := func(m *bucketmap.Map) []bucketmap.NodeID {
		if len(ids) > 0 {
			return ids
		}
		var out []bucketmap.NodeID
		for _, n := range m.Nodes() {
			if n.State != bucketmap.NodeRemoved {
				out = append(out, n.ID)
			}
		}
		return out
	}
	tick := time.NewTicker(max(opt.Retry/4, 20*time.Millisecond))
	defer tick.Stop()
	var m *bucketmap.Map
	log.Info("fence reconciler watching the map", zap.Duration("retry", opt.Retry), zap.Duration("every", opt.Every))
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-mapW.C:
			if !n.Exists {
				log.Warn("fence reconciler: the bucket map does not exist", zap.String("path", n.Path))
				continue
			}
			next, err := bucketmap.Decode(n.Path, n.Data)
			if err != nil {
				log.Warn("fence reconciler: cannot decode the map; keeping the last one", zap.Error(err))
				continue
			}
			if m != nil && next.Version <= m.Version {
				continue
			}
			m = next
			synced := map[bucketmap.NodeID]bool{}
			for _, id := range targets(m) {
				state(id).next = time.Time{}
				synced[id] = true
			}
			known := make([]bucketmap.NodeID, 0, len(nodes))
			for id := range nodes {
				known = append(known, id)
			}
			opt.Metrics.following(m.Version, func(id bucketmap.NodeID) bool { return synced[id] }, known)
		case o := <-results:
			s := state(o.r.Node)
			s.running = false
			r := o.r
			if r.Status == SyncStale && m != nil && o.version == m.Version {
				// Newer than the newest map the watch has delivered.
				r.Status = SyncAhead
				r.Detail = fmt.Sprintf("the fence is at map version %d, ahead of the map (version %d); nothing was changed: the map was restored from an older copy, or the fence was edited", r.From, m.Version)
			}
			opt.Metrics.synced(r)
			switch {
			case m != nil && o.version < m.Version:
				s.next = time.Time{} // the map changed meanwhile
			case r.Status == SyncAhead:
				s.next = time.Now().Add(opt.Every) // for a person to decide
			case r.Bad() || r.Status == SyncStale:
				s.next = time.Now().Add(opt.Retry)
			default:
				s.next = time.Now().Add(opt.Every)
			}
			if r.Status != s.last || r.Status == SyncRepaired {
				fields := []zap.Field{zap.String("node", string(r.Node)), zap.String("status", r.Status), zap.Uint64("map_version", o.version)}
				switch r.Status {
				case SyncRepaired:
					log.Warn("fence reconciler: fence brought in step", append(fields, zap.Uint64("from_map_version", r.From), zap.Strings("added", r.Added), zap.Strings("removed", r.Removed))...)
				case SyncInStep, SyncStale:
					log.Info("fence reconciler: fence in step", fields...)
				default:
					log.Warn("fence reconciler: fence not in step; retrying", append(fields, zap.String("detail", r.Detail), zap.Duration("retry", opt.Retry))...)
				}
				if opt.Report != nil && m != nil {
					opt.Report(m, r)
				}
			}
			s.last = r.Status
		case <-tick.C:
		}
		if m == nil {
			continue
		}
		now := time.Now()
		for _, id := range targets(m) {
			s := state(id)
			if s.running || now.Before(s.next) {
				continue
			}
			s.running = true
			go func(m *bucketmap.Map, id bucketmap.NodeID) {
				r := SyncNode(ctx, m, id, opt.Timeout)
				select {
				case results <- outcome{r: r, version: m.Version}:
				case <-ctx.Done():
				}
			}(m, id)
		}
	}
}
