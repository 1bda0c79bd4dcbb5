package fence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Outcomes of bringing one node's fence in step with a map (NodeSync.Status).
const (
	SyncInStep       = "in-step"       // nothing to change
	SyncRepaired     = "repaired"      // changed to match the map
	SyncNotInstalled = "not-installed" // no fence: writes to the node are not fenced
	SyncStale        = "stale"         // the fence has applied a newer map
	// SyncAhead is what Reconcile makes of SyncStale when the map read
	// again is still older than the fence: not a race with a newer change
	// but a fence ahead of the map (a map restored from an older copy, an
	// edited fence). Nothing was changed; a person must decide.
	SyncAhead       = "ahead"
	SyncUnreachable = "unreachable" // no connection to the node
	SyncFailed      = "failed"      // anything else
)

// NodeSync is the outcome of bringing one node's fence in step with a map.
type NodeSync struct {
	Node    bucketmap.NodeID `json:"node"`
	Status  string           `json:"status"` // one of the Sync* constants
	Detail  string           `json:"detail,omitempty"`
	From    uint64           `json:"from_map_version,omitempty"`
	Added   []string         `json:"added,omitempty"`
	Removed []string         `json:"removed,omitempty"`
}

// Bad reports whether the node could not be brought in step at all.
func (s NodeSync) Bad() bool {
	return s.Status == SyncUnreachable || s.Status == SyncFailed || s.Status == SyncAhead
}

// SyncNodes brings the fences of the given nodes (all of m's, if none) in
// step with m, concurrently, each bounded by timeout, and reports each.
func SyncNodes(ctx context.Context, m *bucketmap.Map, ids []bucketmap.NodeID, timeout time.Duration) []NodeSync {
	if len(ids) == 0 {
		for _, n := range m.Nodes() {
			ids = append(ids, n.ID)
		}
	}
	out := make([]NodeSync, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = SyncNode(ctx, m, id, timeout)
		}()
	}
	wg.Wait()
	return out
}

// SyncNode connects to node id of m and brings its fence in step with m
// (Sync), within timeout.
func SyncNode(ctx context.Context, m *bucketmap.Map, id bucketmap.NodeID, timeout time.Duration) NodeSync {
	res := NodeSync{Node: id}
	n, ok := m.Node(id)
	if !ok {
		res.Status, res.Detail = SyncFailed, "not in the registry"
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := dbnode.Connect(ctx, n)
	if err != nil {
		res.Status, res.Detail = SyncUnreachable, err.Error()
		return res
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ch, err := Sync(ctx, conn, m, id)
	res.From = ch.FromVersion
	switch {
	case errors.Is(err, ErrNotInstalled):
		res.Status, res.Detail = SyncNotInstalled, fmt.Sprintf("no fence: writes to %s are not fenced; run `shardctl node prepare %s`", id, id)
	case errors.Is(err, ErrStale):
		res.Status, res.Detail = SyncStale, err.Error()
	case err != nil:
		res.Status, res.Detail = SyncFailed, err.Error()
	case !ch.Changed():
		res.Status = SyncInStep
	default:
		res.Status = SyncRepaired
		for _, s := range ch.Added {
			res.Added = append(res.Added, fmt.Sprintf("%s %s", BucketsOf(m, s.Lo, s.Hi), s.State))
		}
		for _, s := range ch.Removed {
			res.Removed = append(res.Removed, fmt.Sprintf("%s %s", BucketsOf(m, s.Lo, s.Hi), s.State))
		}
	}
	return res
}

// DefaultSyncTimeout bounds bringing one node's fence in step after a map
// change: the change is made, so a slow node must not hold its author up
// for long; a reconcile repairs what was missed.
const DefaultSyncTimeout = 10 * time.Second

// SyncOptions tune SyncAfterChange.
type SyncOptions struct {
	Timeout time.Duration // per node; 0: DefaultSyncTimeout
	Logger  *zap.Logger   // nil: no logs
}

// SyncAfterChange is the fence sync after an ownership change, done by
// whoever changed the map outside a move, through package ownership
// (shardctl's map commands, the rebalancer's splits): it brings every db node's fence in step with the new map m
// at once, concurrently. The change has already happened, so nothing here
// undoes or fails it: each node's outcome is returned (and logged), and a
// node that could not be updated (unreachable, not prepared) is drift for
// `shardctl node reconcile` to repair. Removed nodes own nothing and are
// left out, unless their fence had to be repaired.
//
// Until the cluster has sharded tables the data side is not in use and
// nothing is done. The error is only for a cluster record that cannot be
// read; no fence was touched then.
func SyncAfterChange(ctx context.Context, s *zksession.Session, p topo.Paths, m *bucketmap.Map, opt SyncOptions) ([]NodeSync, error) {
	log := opt.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if opt.Timeout <= 0 {
		opt.Timeout = DefaultSyncTimeout
	}
	rec, err := topo.ReadCluster(ctx, s, p)
	if err != nil {
		return nil, err
	}
	if len(rec.Tables) == 0 {
		log.Debug("no sharded tables; fences not updated")
		return nil, nil
	}
	var out []NodeSync
	for _, r := range SyncNodes(ctx, m, nil, opt.Timeout) {
		if n, _ := m.Node(r.Node); n.State == bucketmap.NodeRemoved && r.Status != SyncRepaired {
			continue
		}
		switch r.Status {
		case SyncInStep, SyncRepaired, SyncStale:
			log.Info("fence in step", zap.String("node", string(r.Node)), zap.String("status", r.Status), zap.Uint64("map_version", m.Version),
				zap.Strings("added", r.Added), zap.Strings("removed", r.Removed))
		case SyncNotInstalled:
		default:
			log.Warn("fence drift", zap.String("node", string(r.Node)), zap.String("status", r.Status), zap.String("detail", r.Detail), zap.Uint64("map_version", m.Version))
		}
		out = append(out, r)
	}
	return out, nil
}

// ReconcileTimeout bounds one node's sync in Reconcile, which has nobody
// waiting on it and so gives a slow node more time than a map change does.
const ReconcileTimeout = 30 * time.Second

// Reconcile reads the current map and brings the fences of the given
// nodes (all, if none) in step with it, repairing drift; each outcome is
// returned and logged (repairs and failures as warnings). A node that is
// not in the registry is an error wrapping bucketmap.ErrUnknownNode, and
// nothing is synced; so is a map that cannot be read.
func Reconcile(ctx context.Context, st *bucketmap.Store, ids []bucketmap.NodeID, log *zap.Logger) (*bucketmap.Map, []NodeSync, error) {
	if log == nil {
		log = zap.NewNop()
	}
	m, _, err := st.Load(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, id := range ids {
		if _, ok := m.Node(id); !ok {
			return nil, nil, fmt.Errorf("%w %q", bucketmap.ErrUnknownNode, id)
		}
	}
	res := SyncNodes(ctx, m, ids, ReconcileTimeout)
	// A fence newer than the map read is either a change made since (read
	// the map again and sync that node to it) or a fence ahead of the map.
	var stale []int
	for i, r := range res {
		if r.Status == SyncStale {
			stale = append(stale, i)
		}
	}
	if len(stale) > 0 {
		if again, _, err := st.Load(ctx); err == nil && again.Version > m.Version {
			m = again
			for _, i := range stale {
				res[i] = SyncNode(ctx, m, res[i].Node, ReconcileTimeout)
			}
		}
		for _, i := range stale {
			if r := &res[i]; r.Status == SyncStale {
				r.Status = SyncAhead
				r.Detail = fmt.Sprintf("the fence is at map version %d, ahead of the map (version %d); nothing was changed: the map was restored from an older copy, or the fence was edited. If the map is right, see docs/data-contract.md, \"A fence ahead of the map\"", r.From, m.Version)
			}
		}
	}
	for _, r := range res {
		switch r.Status {
		case SyncRepaired:
			log.Warn("reconcile: fence drift repaired", zap.String("node", string(r.Node)), zap.Uint64("from_map_version", r.From),
				zap.Uint64("map_version", m.Version), zap.Strings("added", r.Added), zap.Strings("removed", r.Removed))
		case SyncInStep, SyncStale:
			log.Debug("reconcile", zap.String("node", string(r.Node)), zap.String("status", r.Status))
		default:
			log.Warn("reconcile: fence not in step", zap.String("node", string(r.Node)), zap.String("status", r.Status), zap.String("detail", r.Detail))
		}
	}
	return m, res, nil
}
