package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/backup"
	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/ownership"
	"github.com/shardvisor/shardvisor/schema"
	"github.com/shardvisor/shardvisor/topo"
)

// The data side of `shardctl node`: prepare, check and reconcile the db
// nodes' schema and fences (package fence does the work).

// dataContext is what the data-side commands need from ZooKeeper.
type dataContext struct {
	st  *bucketmap.Store
	m   *bucketmap.Map
	rec *topo.ClusterRecord
	log *zap.Logger
}

func withData(c *cli.Context, fn func(ctx context.Context, d *dataContext) error) error {
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		rec, err := topo.ReadCluster(ctx, st.Session(), st.Paths())
		if err != nil {
			return err
		}
		m, _, err := st.Load(ctx)
		if err != nil {
			return err
		}
		return fn(ctx, &dataContext{st: st, m: m, rec: rec, log: log})
	})
}

func oneNodeArg(c *cli.Context, verb string, m *bucketmap.Map) (bucketmap.Node, error) {
	if c.NArg() != 1 {
		return bucketmap.Node{}, cliutil.Usagef("node %s: want one node ID", verb)
	}
	id := bucketmap.NodeID(c.Args().First())
	n, ok := m.Node(id)
	if !ok {
		return n, fmt.Errorf("node %s: %w %q", verb, bucketmap.ErrUnknownNode, id)
	}
	return n, nil
}

// withNode runs fn with the cluster's data context and a connection to
// the node named by the one argument.
func withNode(c *cli.Context, verb string, fn func(ctx context.Context, d *dataContext, n bucketmap.Node, conn *pgx.Conn) error) error {
	return withData(c, func(ctx context.Context, d *dataContext) error {
		n, err := oneNodeArg(c, verb, d.m)
		if err != nil {
			return err
		}
		conn, err := dbnode.Connect(ctx, n)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		return fn(ctx, d, n, conn)
	})
}

func runPrepare(c *cli.Context) error {
	return withNode(c, "prepare", func(ctx context.Context, d *dataContext, n bucketmap.Node, conn *pgx.Conn) error {
		// The schema first: the fence goes on tables the node has.
		caught, err := schema.CatchUp(ctx, d.st, n.ID, schemaOptions(c, d.log))
		if err != nil {
			return fmt.Errorf("node prepare %s: %w", n.ID, err)
		}
		res, err := fence.Prepare(ctx, conn, d.rec, d.m, n.ID)
		if err != nil {
			return fmt.Errorf("node prepare %s: %w", n.ID, err)
		}
		mism := res.Mismatches
		d.log.Info("node prepare", zap.String("node", string(n.ID)), zap.Strings("actions", res.Actions), zap.Int("contract_mismatches", len(mism)))
		if caught != nil && len(caught.Ran) > 0 {
			res.Actions = append([]string{fmt.Sprintf("schema brought in step with the recorded history: ran %s", strings.Join(caught.Ran, ", "))}, res.Actions...)
		}
		if res.Actions == nil {
			res.Actions = []string{}
		}
		if mism == nil {
			mism = []fence.Mismatch{}
		}
		out := map[string]any{"node": n.ID, "map_version": d.m.Version, "actions": res.Actions, "problems": res.Problems, "mismatches": mism}
		if perr := cliutil.NewPrinter(c).Emit(out, func(w io.Writer) {
			if len(res.Actions) == 0 {
				fmt.Fprintf(w, "node %s is prepared; nothing changed (fence at map version %d)\n", n.ID, d.m.Version)
			}
			for _, a := range res.Actions {
				fmt.Fprintf(w, "node %s: %s\n", n.ID, a)
			}
			for _, p := range res.Problems {
				fmt.Fprintf(w, "node %s: PROBLEM: %s\n", n.ID, p)
			}
			writeMismatches(w, n.ID, mism)
		}); perr != nil {
			return perr
		}
		if len(res.Problems)+len(mism) > 0 {
			if caught == nil && slices.ContainsFunc(mism, func(x fence.Mismatch) bool { return x.Kind == fence.KindTableMissing }) {
				return hint.New(fmt.Errorf("node %s breaks the sharded-table contract (%d problems): it lacks sharded tables and no schema history is recorded to replay", n.ID, len(res.Problems)+len(mism)),
					"run `shardctl schema adopt --from NODE` with a node that has the schema, then prepare again")
			}
			return fmt.Errorf("node %s breaks the sharded-table contract (%d problems); fix them and run prepare again", n.ID, len(res.Problems)+len(mism))
		}
		return nil
	})
}

func writeMismatches(w io.Writer, id bucketmap.NodeID, mism []fence.Mismatch) {
	for _, x := range mism {
		where := ""
		if x.Table != "" {
			where = " " + x.Table
		}
		fmt.Fprintf(w, "node %s: MISMATCH %s%s: %s\n", id, x.Kind, where, x.Message)
	}
}

func runCheck(c *cli.Context) error {
	return withNode(c, "check", func(ctx context.Context, d *dataContext, n bucketmap.Node, conn *pgx.Conn) error {
		mism, err := fence.Check(ctx, conn, d.rec, d.m, n.ID)
		if err != nil {
			return err
		}
		if len(mism) > 0 {
			// A map change between reading the map and the fence (a move
			// syncs the fence after the map) is not drift: check again
			// against the newest map.
			if m, _, lerr := d.st.Load(ctx); lerr == nil && m.Version != d.m.Version {
				d.m = m
				if mism, err = fence.Check(ctx, conn, d.rec, d.m, n.ID); err != nil {
					return err
				}
			}
		}
		cross, err := schemaAcrossNodes(ctx, c, d, n, conn)
		if err != nil {
			return err
		}
		mism = append(mism, cross...)
		if mism == nil {
			mism = []fence.Mismatch{}
		}
		bud := checkBudget(ctx, d.st.Session(), d.st.Paths(), n, conn, c.Int("pool-size"))
		out := map[string]any{"node": n.ID, "map_version": d.m.Version, "tables": len(d.rec.Tables), "mismatches": mism, "connection_budget": bud}
		// Backups: a problem only once the cluster has a backup
		// configuration (backups were set up and something broke).
		var bs *backup.NodeStatus
		if cfg, _, err := topo.ReadBackupConfig(ctx, d.st.Session(), d.st.Paths()); err == nil {
			ns := backup.CheckNode(ctx, pgbackrestOf(c), cfg, cfg.Configured(), n, conn, time.Now())
			bs = &ns
			out["backup"] = ns
		}
		// A group's configuration is part of the contract: without
		// synchronous_mode a failover loses acknowledged writes, without
		// ignore_slots Patroni drops a move's slot.
		var g *topo.PatroniView
		severe := 0
		if !n.Patroni.IsZero() {
			g = readGroup(ctx, d.st.Session(), n)
			out["group"] = g
			for _, p := range g.Problems {
				if p.Severe {
					severe++
				}
			}
			if g.Error != "" {
				severe++
			}
		}
		if perr := cliutil.NewPrinter(c).Emit(out, func(w io.Writer) {
			if len(mism) == 0 && severe == 0 {
				fmt.Fprintf(w, "node %s: ok (%d sharded tables, fence at map version %d)\n", n.ID, len(d.rec.Tables), d.m.Version)
			}
			writeMismatches(w, n.ID, mism)
			if g != nil {
				writeGroup(w, n.ID, g)
			}
			writeBudget(w, n.ID, bud)
			if bs != nil && (bs.Configured || len(bs.Problems) > 0) {
				writeBackupStatus(w, *bs, false, nil)
			}
		}); perr != nil {
			return perr
		}
		if bs != nil && len(bs.Problems) > 0 {
			severe += len(bs.Problems)
		}
		if severe > 0 {
			return fmt.Errorf("node %s: %d mismatches, %d Patroni group and backup problems", n.ID, len(mism), severe)
		}
		if len(mism) > 0 {
			return fmt.Errorf("node %s: %d mismatches", n.ID, len(mism))
		}
		return nil
	})
}

// writeSync prints one node's reconcile outcome for people.
func writeSync(w io.Writer, m *bucketmap.Map, r fence.NodeSync) {
	switch r.Status {
	case fence.SyncInStep:
		fmt.Fprintf(w, "node %s: in step with map version %d\n", r.Node, m.Version)
	case fence.SyncRepaired:
		fmt.Fprintf(w, "node %s: DRIFT repaired (fence was at map version %d, now %d): %d ranges added, %d removed\n", r.Node, r.From, m.Version, len(r.Added), len(r.Removed))
		for _, a := range r.Added {
			fmt.Fprintf(w, "  + %s\n", a)
		}
		for _, a := range r.Removed {
			fmt.Fprintf(w, "  - %s\n", a)
		}
	case fence.SyncAhead:
		fmt.Fprintf(w, "node %s: AHEAD of the map: %s\n", r.Node, r.Detail)
	default:
		fmt.Fprintf(w, "node %s: %s: %s\n", r.Node, r.Status, r.Detail)
	}
}

// reconcileError is the error of a one-shot reconcile with bad outcomes.
func reconcileError(res []fence.NodeSync) error {
	bad, ahead := 0, []string{}
	for _, r := range res {
		if r.Status == fence.SyncAhead {
			ahead = append(ahead, string(r.Node))
		} else if r.Bad() {
			bad++
		}
	}
	switch {
	case len(ahead) > 0:
		return fmt.Errorf("node reconcile: the fence of %s is ahead of the map, which no sync takes back in time; check the map (was it restored from an older copy?) before anything else; %d other nodes could not be brought in step", strings.Join(ahead, ", "), bad)
	case bad > 0:
		return fmt.Errorf("node reconcile: %d nodes could not be brought in step", bad)
	}
	return nil
}

// runReconcileWatch is `node reconcile --watch`: the continuous reconciler
// (ownership.Watch), printing every change of a node's outcome.
func runReconcileWatch(c *cli.Context, ids []bucketmap.NodeID) error {
	p := cliutil.NewPrinter(c)
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		reg := prometheus.NewRegistry()
		metrics := fence.NewWatchMetrics(reg)
		stop, err := serveMetricsFlag(c, reg, log)
		if err != nil {
			return err
		}
		defer stop()
		return ownership.Watch(ctx, st, ids, fence.WatchOptions{
			Retry: c.Duration("retry"), Every: c.Duration("every"), Timeout: c.Duration("timeout"), Logger: log, Metrics: metrics,
			Report: func(m *bucketmap.Map, r fence.NodeSync) {
				_ = p.Emit(map[string]any{"map_version": m.Version, "node": r}, func(w io.Writer) { writeSync(w, m, r) })
			},
		})
	})
}

func runReconcile(c *cli.Context) error {
	var ids []bucketmap.NodeID
	for _, a := range c.Args().Slice() {
		ids = append(ids, bucketmap.NodeID(a))
	}
	if c.Duration("retry") < 0 || c.Duration("timeout") < 0 || c.Duration("every") < 0 {
		return cliutil.Usagef("node reconcile: --every, --retry and --timeout must not be negative")
	}
	if c.Bool("watch") {
		return runReconcileWatch(c, ids)
	}
	if c.String("metrics-addr") != "" {
		return cliutil.Usagef("node reconcile: --metrics-addr serves the metrics of --watch only")
	}
	every := c.Duration("every")
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		for {
			m, res, err := ownership.Reconcile(ctx, st, ids, log)
			if errors.Is(err, bucketmap.ErrUnknownNode) {
				return fmt.Errorf("node reconcile: %w", err)
			}
			if err != nil {
				if every == 0 {
					return err
				}
				log.Warn("reconcile: cannot read the map", zap.Error(err))
			} else {
				if err := cliutil.NewPrinter(c).Emit(map[string]any{"map_version": m.Version, "nodes": res}, func(w io.Writer) {
					for _, r := range res {
						writeSync(w, m, r)
					}
				}); err != nil {
					return err
				}
				if every == 0 {
					return reconcileError(res)
				}
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(every):
			}
		}
	})
}
