package backup

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/ownership"
	"github.com/shardvisor/shardvisor/topo"
)

// Restoring the whole cluster to a restore point (docs/backups.md, "Whole
// cluster"): every node's server is recovered from its stanza to the
// point's WAL name into a new server (RecoveryCommand says how), each
// node's DSN is pointed at its new server (shardctl node set-dsn), and
// then ApplyPointMap makes the map what it was at the point and clears
// what the moves in flight then left on the recovered servers.

// RecoveryCommand is the pgBackRest command that recovers node's server to
// the point into dataDir from backup set (ChooseSet), for the runbook (run
// on the new db host, as the repository's owner). The server it gives
// starts without logical replication workers: a subscription of a move in
// flight at the point names the old source and would stream from it (or
// from whatever answers there) until apply-map has dropped it.
func RecoveryCommand(rp *topo.RestorePoint, node, dataDir, set string) (string, error) {
	pn, ok := rp.Nodes[node]
	if !ok {
		return "", fmt.Errorf("restore point %s has no node %s", rp.Name, node)
	}
	if pn.Stanza == "" {
		return "", fmt.Errorf("node %s had no pgBackRest stanza at restore point %s: recover it from a base backup taken by other means, to the restore point named %q", node, rp.Name, rp.WALName)
	}
	args := restoreArgs(dataDir, set, Target{Name: rp.WALName, LSN: pn.LSN}, nil)
	// The new server archives on its new timeline into the same stanza:
	// its archive_command is its own configuration's. (For a drill beside
	// the live cluster, add --archive-mode=off.)
	args = slicesDelete(args, "--archive-mode=off")
	args = append(args, "--recovery-option=max_logical_replication_workers=0")
	return "pgbackrest --stanza=" + pn.Stanza + " " + strings.Join(args, " ") + " restore", nil
}

// ErrNotRecovered means a node's server is not one recovered to the point
// (its fence is past the point's): apply-map would roll a live cluster back.
var ErrNotRecovered = errors.New("not recovered to the restore point")

func slicesDelete(s []string, v string) []string {
	out := s[:0]
	for _, x := range s {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}

// ApplyResult says what ApplyPointMap did.
type ApplyResult struct {
	Point      string             `json:"point"`
	MapVersion uint64             `json:"map_version"` // the map's new version
	From       uint64             `json:"point_map_version"`
	Moves      []MoveTeardown     `json:"moves"`
	Drift      []ownership.Drift  `json:"drift,omitempty"`
	Ownership  *ownership.Result  `json:"-"`
	Nodes      []bucketmap.NodeID `json:"nodes"`
}

// MoveTeardown is what was cleared of a move in flight at the point.
type MoveTeardown struct {
	ID      string   `json:"id"`
	Flipped bool     `json:"flipped"` // the point's map names its target
	Done    []string `json:"done"`
	Errors  []string `json:"errors,omitempty"`
}

// ApplyPointMap makes the cluster's map the one recorded with restore point
// name: its buckets and owners (every bucket active), under the node
// registry of now (the recovered servers' DSNs), at a new version above
// the current one, so that every fence syncs forward to it. Then, for each
// move in flight at the point, on the recovered servers: its
// subscriptions, slots and publications are dropped (a recovered
// subscription would stream from the recovered source, a reverse one
// back), and an unflipped move's partial copy on its target is deleted.
// Run it only after every node's DSN names its recovered server.
func ApplyPointMap(ctx context.Context, st *bucketmap.Store, name string, log *zap.Logger) (*ApplyResult, error) {
	if log == nil {
		log = zap.NewNop()
	}
	s, p := st.Session(), st.Paths()
	rp, err := topo.ReadRestorePoint(ctx, s, p, name)
	if err != nil {
		return nil, fmt.Errorf("restore point %s: %w", name, err)
	}
	data, err := topo.ReadRestorePointMap(ctx, s, p, name)
	if err != nil {
		return nil, fmt.Errorf("restore point %s: its map: %w", name, err)
	}
	pm, err := bucketmap.Decode(p.RestorePointMap(name), data)
	if err != nil {
		return nil, err
	}
	rec, err := topo.ReadCluster(ctx, s, p)
	if err != nil {
		return nil, err
	}
	res := &ApplyResult{Point: name, From: pm.Version}
	cur, _, err := st.Load(ctx)
	if err != nil {
		return nil, err
	}
	// Only on servers recovered to the point: each node's fence must be
	// at most where it was at the point. A live server's fence has moved
	// on with the map (or will have, once the map changes), and applying
	// the point's map to a live cluster would give every bucket moved
	// since back to an owner whose copy GC has pruned.
	if err := checkRecovered(ctx, cur, pm, rp); err != nil {
		return nil, err
	}
	// The moves' objects first: a recovered subscription must not stream
	// into ranges the fences are about to settle.
	for _, mv := range rp.Moves {
		res.Moves = append(res.Moves, teardown(ctx, cur, pm, rec.Tables, mv, log))
	}
	or, err := ownership.New(st, ownership.Options{Logger: log}).Change(ctx, func(m *bucketmap.Map) error {
		return m.RestoreOwnership(pm)
	})
	if err != nil {
		return nil, err
	}
	res.Ownership, res.MapVersion = or, or.Map.Version
	res.Drift = or.Drift()
	for _, n := range or.Map.Nodes() {
		res.Nodes = append(res.Nodes, n.ID)
	}
	return res, nil
}

// checkRecovered refuses unless every node's fence is at most at the
// point's version, or (a run again, after one that did not reach every
// node) at the current map's version with the map already the point's.
func checkRecovered(ctx context.Context, cur, pm *bucketmap.Map, rp *topo.RestorePoint) error {
	again := sameOwners(cur, pm)
	var bad []string
	for id, pn := range rp.Nodes {
		n, ok := cur.Node(bucketmap.NodeID(id))
		if !ok {
			return hint.New(fmt.Errorf("restore point %s names node %s, which the map no longer has", rp.Name, id), "shardctl node add "+id+" DSN (its recovered server)")
		}
		c, err := dbnode.Connect(ctx, n)
		if err != nil {
			return fmt.Errorf("node %s: %w", id, err)
		}
		var v int64
		err = c.QueryRow(ctx, `SELECT map_version FROM shardvisor.fence_meta`).Scan(&v)
		c.Close(context.WithoutCancel(ctx))
		if err != nil {
			return fmt.Errorf("node %s: its fence: %w", id, err)
		}
		if uint64(v) > pn.FenceVersion && !(again && uint64(v) == cur.Version) {
			bad = append(bad, fmt.Sprintf("%s (fence at map version %d, %d at the point)", id, v, pn.FenceVersion))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return hint.New(fmt.Errorf("%w: %s", ErrNotRecovered, strings.Join(bad, ", ")),
			"recover each node's server first (shardctl restore-point show "+rp.Name+") and point the node at it (shardctl node set-dsn)")
	}
	return nil
}

// sameOwners: a and b have the same buckets with the same owners, every
// bucket active.
func sameOwners(a, b *bucketmap.Map) bool {
	if a.Level != b.Level || a.Buckets() != b.Buckets() {
		return false
	}
	same := true
	b.EachBucket(func(bk bucketmap.Bucket, _, _ uint32) bool {
		same = a.Has(bk) && a.OwnerOf(bk) == b.OwnerOf(bk) && a.MetaOf(bk).State != bucketmap.BucketMoving
		return same
	})
	return same
}

// teardown clears one move in flight at the point from the recovered
// servers. Each step is idempotent; failures are reported, not fatal
// (a node down is told, and ApplyPointMap can be run again).
func teardown(ctx context.Context, cur, pm *bucketmap.Map, tables []topo.TableRecord, mv topo.PointMove, log *zap.Logger) MoveTeardown {
	td := MoveTeardown{ID: mv.ID, Done: []string{}}
	b, err := bucketmap.ParseBucket(mv.Bucket)
	if err == nil && pm.Has(b) && string(pm.OwnerOf(b)) == mv.Target && mv.Target != mv.Source {
		td.Flipped = true
	}
	on := func(node string, fn func(c *pgx.Conn) error) {
		n, ok := cur.Node(bucketmap.NodeID(node))
		if !ok {
			td.Errors = append(td.Errors, "no node "+node+" in the map")
			return
		}
		c, err := dbnode.Connect(ctx, n)
		if err != nil {
			td.Errors = append(td.Errors, fmt.Sprintf("%s: %v", node, err))
			return
		}
		defer c.Close(context.WithoutCancel(ctx))
		if err := fn(c); err != nil {
			td.Errors = append(td.Errors, fmt.Sprintf("%s: %v", node, err))
		}
	}
	dropSub := func(node, sub string) {
		if sub == "" {
			return
		}
		on(node, func(c *pgx.Conn) error {
			var exists bool
			if err := c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_subscription WHERE subname = $1)`, sub).Scan(&exists); err != nil || !exists {
				return err
			}
			q := quoteIdent(sub)
			// Detached from its slot first: the slot is on a recovered
			// server that may not answer, and is dropped there below.
			for _, stmt := range []string{`ALTER SUBSCRIPTION ` + q + ` DISABLE`, `ALTER SUBSCRIPTION ` + q + ` SET (slot_name = NONE)`, `DROP SUBSCRIPTION ` + q} {
				if _, err := c.Exec(ctx, stmt); err != nil {
					return err
				}
			}
			td.Done = append(td.Done, "dropped subscription "+sub+" on "+node)
			return nil
		})
	}
	dropSlotPub := func(node, slot, pub string) {
		on(node, func(c *pgx.Conn) error {
			if slot != "" {
				tag, err := c.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, slot)
				if err != nil {
					return err
				}
				if tag.RowsAffected() > 0 {
					td.Done = append(td.Done, "dropped slot "+slot+" on "+node)
				}
			}
			if pub != "" {
				if _, err := c.Exec(ctx, `DROP PUBLICATION IF EXISTS `+quoteIdent(pub)); err != nil {
					return err
				}
				td.Done = append(td.Done, "dropped publication "+pub+" on "+node)
			}
			return nil
		})
	}
	dropSub(mv.Target, mv.Subscription)
	dropSub(mv.Source, mv.ReverseSubscription)
	dropSlotPub(mv.Source, mv.Slot, mv.Publication)
	dropSlotPub(mv.Target, mv.ReverseSlot, mv.ReversePublication)
	if !td.Flipped && mv.Target != mv.Source && mv.Hi >= mv.Lo {
		// The target's partial copy of a range it never owned.
		on(mv.Target, func(c *pgx.Conn) error {
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
				return err
			}
			var n int64
			for _, t := range tables {
				tag, err := tx.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE %s BETWEEN $1 AND $2`, qualified(t.Name), quoteIdent(t.KeyColumn)), mv.Lo, mv.Hi)
				if err != nil {
					return err
				}
				n += tag.RowsAffected()
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			td.Done = append(td.Done, fmt.Sprintf("deleted %d rows of the unfinished copy on %s", n, mv.Target))
			return nil
		})
	}
	if len(td.Errors) > 0 {
		log.Warn("restore: a move's teardown", zap.String("move", mv.ID), zap.Error(errors.New(strings.Join(td.Errors, "; "))))
	}
	return td
}
