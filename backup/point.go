package backup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// A cluster restore point is a named WAL record on every db node's
// primary, all written while the map stayed at one version, and a record
// in ZooKeeper of that version, the map itself, the moves in flight and
// each node's LSN.
//
// Why no write is held. Every transaction of the application runs on one
// node, so each node's own point is a consistent state of that node by
// itself (PostgreSQL's recovery stops at the point's WAL record: what
// committed before it, nothing after). What ties the nodes together is
// ownership, and ownership changes only through the map: a move's data
// reaches its target before the flip (the barrier), and the source is
// frozen from before the flip on. So the nodes' points form one cut if no
// map change happened between the first node's point and the last one's.
// The cut reads the map's znode version, writes every node's point at
// once, and reads the version again: unchanged, the cut holds; changed (a
// flip, a split, a node edit in between), it is void and taken again under
// a new WAL name, up to MaxAttempts times. No application write waits for
// any of it. A flip whose fence sync had not reached a node yet when its
// point was written is drift that `node reconcile` repairs after a
// restore, as after any interrupted sync.

// MaxAttempts bounds the cuts one CreatePoint tries.
const MaxAttempts = 5

// ArchiveWait bounds the wait for a point's WAL segment (or the WAL up to
// a restore's time) to reach the archive.
var ArchiveWait = 60 * time.Second

// sameMoves: the same moves, in the same states.
func sameMoves(a, b []topo.PointMove) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].State != b[i].State {
			return false
		}
	}
	return true
}

// ErrPointVoid means the map changed during every cut tried.
var ErrPointVoid = errors.New("the map changed during every cut")

// PointOptions qualify CreatePoint.
type PointOptions struct {
	Reason string
	By     string
	// Config names each node's stanza (recorded with the point).
	Config *topo.BackupConfig
	// SwitchWAL: after the cut, each node switches to a new WAL segment,
	// so that the point is archived now rather than within archive_timeout
	// (a point is recoverable only once its segment is in the archive).
	SwitchWAL bool
	Logger    *zap.Logger
}

// WALName is the name a point's WAL records carry on every node: the
// point's name and the cut's time, unique, so that a name used again (a
// scheduled point, a point deleted and made anew) never stops a recovery
// at an older record of the same name.
func WALName(name string, at time.Time) string {
	return name + "@" + strconv.FormatInt(at.UnixMilli(), 36)
}

// CreatePoint cuts a restore point named name across every db node that is
// not removed (a node down fails it: its point cannot be written) and
// records it. It takes the backup lock, so points never interleave.
func CreatePoint(ctx context.Context, st *bucketmap.Store, name string, opt PointOptions) (*topo.RestorePoint, error) {
	if err := topo.ValidPointName(name); err != nil {
		return nil, err
	}
	log := opt.Logger
	if log == nil {
		log = zap.NewNop()
	}
	s, p := st.Session(), st.Paths()
	if _, err := topo.ReadRestorePoint(ctx, s, p, name); err == nil {
		return nil, hint.New(fmt.Errorf("%w: %s", topo.ErrPointExists, name), "choose another name, or `shardctl restore-point delete "+name+"` first")
	} else if !errors.Is(err, zksession.ErrNoNode) {
		return nil, err
	}
	holder := []byte(fmt.Sprintf("restore point %s by %s pid %d", name, opt.By, os.Getpid()))
	lock, err := topo.LockBackup(ctx, s, p, holder, func(le *zksession.LockedError) {
		log.Info("restore point: waiting for the backup lock", zap.ByteString("holder", le.Holder))
	})
	if err != nil {
		return nil, fmt.Errorf("taking the backup lock: %w", err)
	}
	defer lock.Release(context.WithoutCancel(ctx))
	ctx, cancel := lock.Context(ctx)
	defer cancel()
	cfg := opt.Config
	if cfg == nil {
		if cfg, _, err = topo.ReadBackupConfig(ctx, s, p); err != nil {
			return nil, err
		}
	}
	conns := map[bucketmap.NodeID]*pgx.Conn{}
	defer func() {
		for _, c := range conns {
			c.Close(context.WithoutCancel(ctx))
		}
	}()
	for attempt := 1; attempt <= MaxAttempts; attempt++ {
		data, zv, err := topo.ReadMapData(ctx, s, p)
		if err != nil {
			return nil, err
		}
		m, err := bucketmap.Decode(p.Map(), data)
		if err != nil {
			return nil, err
		}
		moves, err := movesInFlight(ctx, s, p)
		if err != nil {
			return nil, err
		}
		// Connections are opened before the cut, so that the cut is as
		// short as a round trip to the slowest node.
		var nodes []bucketmap.Node
		for _, n := range m.Nodes() {
			if n.State == bucketmap.NodeRemoved {
				continue
			}
			nodes = append(nodes, n)
			if conns[n.ID] != nil {
				continue
			}
			c, err := dbnode.Connect(ctx, n)
			if err != nil {
				return nil, hint.New(fmt.Errorf("restore point %s: node %s: %w", name, n.ID, err), "a point needs every node that is not removed: bring it back, or take the point later")
			}
			conns[n.ID] = c
		}
		at := time.Now().UTC()
		wal := WALName(name, at)
		pts := make(map[string]topo.PointNode, len(nodes))
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make([]error, len(nodes))
		cutStart := time.Now()
		for i, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pn, err := pointOn(ctx, conns[n.ID], wal)
				if err != nil {
					errs[i] = fmt.Errorf("node %s: %w", n.ID, err)
					return
				}
				pn.Stanza = cfg.Stanzas[string(n.ID)]
				mu.Lock()
				pts[string(n.ID)] = pn
				mu.Unlock()
			}()
		}
		wg.Wait()
		cut := time.Since(cutStart)
		if err := errors.Join(errs...); err != nil {
			return nil, fmt.Errorf("restore point %s: %w", name, err)
		}
		_, zv2, err := topo.ReadMapData(ctx, s, p)
		if err != nil {
			return nil, err
		}
		if zv2 != zv {
			log.Info("restore point: the map changed during the cut; cutting again", zap.String("point", name), zap.Int("attempt", attempt))
			continue
		}
		// A move that began without a map change since (its record, its
		// target's incoming range, its subscription) would be missing
		// from the point: void the cut as for a map change.
		moves2, err := movesInFlight(ctx, s, p)
		if err != nil {
			return nil, err
		}
		if !sameMoves(moves, moves2) {
			log.Info("restore point: a move began or ended during the cut; cutting again", zap.String("point", name), zap.Int("attempt", attempt))
			continue
		}
		if opt.SwitchWAL {
			// The point is recoverable once its segment is archived: wait
			// for it (bounded), and record whether it was.
			var wg sync.WaitGroup
			for _, n := range nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := ArchiveNow(ctx, conns[n.ID], ArchiveWait)
					mu.Lock()
					defer mu.Unlock()
					pn := pts[string(n.ID)]
					pn.Archived = err == nil
					pts[string(n.ID)] = pn
					if err != nil {
						log.Warn("restore point: its WAL is not archived yet", zap.String("node", string(n.ID)), zap.Error(err))
					}
				}()
			}
			wg.Wait()
		}
		rp := &topo.RestorePoint{
			Version: topo.RestorePointVersion, Name: name, WALName: wal, At: at, By: opt.By, Reason: opt.Reason,
			MapVersion: m.Version, Moves: moves, Nodes: pts, CutMS: float64(cut.Microseconds()) / 1000, Attempts: attempt,
		}
		if rp.Reason == "" {
			rp.Reason = "manual"
		}
		if err := topo.CreateRestorePoint(ctx, s, p, rp, data); err != nil {
			return nil, err
		}
		return rp, nil
	}
	return nil, hint.New(fmt.Errorf("restore point %s: %w (%d tries)", name, ErrPointVoid, MaxAttempts), "the map is changing fast (a rebalance?): try again, or take the point between moves")
}

// pointOn writes the WAL record on one node's primary.
func pointOn(ctx context.Context, c *pgx.Conn, wal string) (topo.PointNode, error) {
	var pn topo.PointNode
	var fenceVersion int64
	err := c.QueryRow(ctx, `SELECT pg_create_restore_point($1)::text,
		(SELECT timeline_id FROM pg_control_checkpoint()),
		coalesce(inet_server_addr()::text, current_setting('unix_socket_directories')) || ':' || current_setting('port'),
		coalesce((SELECT map_version FROM shardvisor.fence_meta), 0)`, wal).Scan(&pn.LSN, &pn.Timeline, &pn.Server, &fenceVersion)
	pn.FenceVersion = uint64(fenceVersion)
	return pn, err
}

// movesInFlight lists the moves not in a final state.
func movesInFlight(ctx context.Context, s *zksession.Session, p topo.Paths) ([]topo.PointMove, error) {
	ids, err := topo.ListMoves(ctx, s, p)
	if err != nil {
		return nil, err
	}
	var out []topo.PointMove
	for _, id := range ids {
		rec, _, err := topo.ReadMove(ctx, s, p, id)
		if errors.Is(err, zksession.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if topo.MoveStateFinal(rec.State) {
			continue
		}
		b := bucketmap.Bucket{Prefix: rec.Bucket, Depth: rec.Level}
		pm := topo.PointMove{ID: rec.ID, Bucket: b.String(), Lo: rec.Lo, Hi: rec.Hi, Source: rec.Source, Target: rec.Target, State: rec.State,
			Publication: rec.Publication, Slot: rec.Slot, Subscription: rec.Subscription}
		if r := rec.Reverse; r != nil {
			pm.ReversePublication, pm.ReverseSlot, pm.ReverseSubscription = r.Publication, r.Slot, r.Subscription
		}
		out = append(out, pm)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
