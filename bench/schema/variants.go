package main

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/benchkit/kvload"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/schema"
)

// variant applies one change under the write load; with holdFor > 0, a
// long transaction holds a row lock on app.kv on one node meanwhile.
// The change is ALTER TABLE app.kv ADD COLUMN column ... NOT NULL DEFAULT.
func (b *bench) variant(ctx context.Context, m *bucketmap.Map, name, column string, holdFor time.Duration) (Variant, error) {
	v := Variant{Name: name, SQL: fmt.Sprintf("ALTER TABLE app.kv ADD COLUMN %s text NOT NULL DEFAULT 'none';\n", column)}
	ch, err := schema.Parse("add-"+column+".sql", v.SQL)
	if err != nil {
		return v, err
	}
	v.ChangeID = ch.ID
	say("\n%s: %d writers, warming up %s", name, *load.Writers, *warmup)

	// The long transaction's node and row (a user owned by that node that
	// no writer touches).
	var holdConn *pgx.Conn
	holdKey, holdUID := int64(0), ""
	if holdFor > 0 {
		node := b.nodes[0] // the canary: the fewest buckets, ties to the lowest id
		v.HoldNode = string(node.ID)
		for i := 0; ; i++ {
			holdUID = fmt.Sprintf("hold-%d", i)
			p := b.ks.Prefix64(holdUID)
			if m.Owner(keystream.BucketOf(p, m.Level)) == node.ID {
				holdKey = keystream.Key(p)
				break
			}
		}
		if holdConn, err = dbnode.Connect(ctx, node); err != nil {
			return v, err
		}
		defer holdConn.Close(context.Background())
		if _, err := holdConn.Exec(ctx, `INSERT INTO app.kv (bkey, uid, v) VALUES ($1, $2, 0) ON CONFLICT DO NOTHING`, holdKey, holdUID); err != nil {
			return v, fmt.Errorf("%s: the long transaction's row: %w", node.ID, err)
		}
	}

	// The write load: closed-loop writers, their new users named after
	// this load.
	run := time.Now().UnixNano()
	l := kvload.Start(kvload.Options{Router: b.r, Keystream: b.ks, Level: *load.Level, Writers: *load.Writers, InsertFrac: *load.InsertFrac,
		Users: *rowsN, Fresh: fmt.Sprintf("n%d-", run), Seed: uint64(run)})
	defer l.Stop() // Stop is idempotent: it also stops before the windows
	if err := benchkit.Sleep(ctx, *warmup); err != nil {
		return v, err
	}
	phase := time.Now() // the change phase begins: the baseline window ends here

	// The long transaction: BEGIN; UPDATE the row (its lock held from
	// here); pg_sleep; COMMIT, in the background.
	holdDone := make(chan error, 1)
	if holdConn != nil {
		tx, err := holdConn.Begin(ctx)
		if err != nil {
			return v, err
		}
		if _, err := tx.Exec(ctx, `UPDATE app.kv SET v = v + 1 WHERE bkey = $1 AND uid = $2`, holdKey, holdUID); err != nil {
			_ = tx.Rollback(context.Background())
			return v, fmt.Errorf("long transaction: %w", err)
		}
		holdStart := time.Now()
		go func() {
			_, err := tx.Exec(ctx, fmt.Sprintf("SELECT pg_sleep(%f)", holdFor.Seconds()))
			if err == nil {
				err = tx.Commit(ctx)
			} else {
				_ = tx.Rollback(context.Background())
			}
			v.HoldMS = benchkit.MS(time.Since(holdStart))
			holdDone <- err
		}()
		_ = benchkit.Sleep(ctx, 100*time.Millisecond)
	} else {
		holdDone <- nil
	}

	applyStart := time.Now()
	res, applyErr := schema.Apply(ctx, b.st, ch, schema.Options{})
	applyEnd := time.Now()
	v.ApplyMS = benchkit.MS(applyEnd.Sub(applyStart))
	if applyErr != nil {
		v.ApplyError = applyErr.Error()
	}
	if res != nil {
		v.Canary, v.State, v.Nodes = res.Canary, res.State, res.Nodes
		for _, n := range res.Nodes {
			v.Attempts += n.Attempts
			v.LockTimeout += n.LockTimeouts
			v.BlockedMax = max(v.BlockedMax, n.BlockedMaxMS)
		}
	}
	if err := benchkit.Sleep(ctx, *tail); err != nil {
		return v, err
	}
	if herr := <-holdDone; herr != nil {
		v.HoldError = herr.Error()
	}
	l.Stop()
	end := time.Now()

	// The windows: the change window from the apply's start, as long as
	// the apply (at least a second); the baseline window as long,
	// ending where the change phase began (clipped to the load's first
	// half second, when the pools fill).
	length := max(applyEnd.Sub(applyStart), time.Second)
	writes := l.Result().Writes
	v.During = window(l, writes, applyStart, applyStart.Add(length))
	blo := max(phase.Add(-length).Sub(l.Started), 500*time.Millisecond)
	v.Baseline = window(l, writes, l.Started.Add(blo), phase)
	v.Writes, v.Failed = len(writes), int(l.Failed.Load())
	v.LoadSeconds = end.Sub(l.Started).Seconds()
	v.WritesPerSec = float64(v.Writes) / v.LoadSeconds
	if p := l.LastErr.Load(); p != nil {
		v.LastError = *p
	}
	v.MaxRatio = jsonRatio(v.During.LatencyMS.Max, v.Baseline.LatencyMS.Max)

	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v.ColumnOn, err = b.columnOn(cctx, column)
	v.GoalMet = applyErr == nil && v.Failed == 0 && v.During.LatencyMS.Max < waitGoalMS && v.ColumnOn == len(b.nodes) && v.HoldError == ""
	if err == nil {
		err = applyErr
	}
	return v, err
}

// columnOn counts the nodes whose app.kv has the column.
func (b *bench) columnOn(ctx context.Context, column string) (int, error) {
	var on atomic.Int32
	err := clustertest.EachNode(ctx, b.nodes, func(_ int, _ bucketmap.Node, c *pgx.Conn) error {
		var ok bool
		err := c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'app.kv'::regclass AND attname = $1 AND NOT attisdropped)`, column).Scan(&ok)
		if ok {
			on.Add(1)
		}
		return err
	})
	return int(on.Load()), err
}

func (b *bench) diff(ctx context.Context, m *bucketmap.Map) (*DiffRun, error) {
	d := &DiffRun{Tables: len(b.tables), Nodes: len(b.nodes)}
	say("\nschema diff: %d runs over %d tables on %d nodes", *diffRuns, len(b.tables), len(b.nodes))
	var own []float64
	for i := range *diffRuns {
		start := time.Now()
		res, err := schema.Diff(ctx, m, b.tables, nil, "", 0)
		el := benchkit.MS(time.Since(start))
		if err != nil {
			return d, err
		}
		d.Runs = append(d.Runs, el)
		own = append(own, res.ElapsedMS)
		d.Differences, d.Unreachable = len(res.Diffs), len(res.Unreachable)
		if res.Tables != len(b.tables) || len(res.Nodes) != len(b.nodes) {
			return d, fmt.Errorf("schema.Diff compared %d tables on %d nodes, want %d on %d", res.Tables, len(res.Nodes), len(b.tables), len(b.nodes))
		}
		say("  run %d: %.1f ms (%d differences, %d unreachable, reference %s)", i+1, el, len(res.Diffs), len(res.Unreachable), res.Reference)
	}
	d.MS, d.ElapsedMS, d.MinMS = benchkit.Of(d.Runs), benchkit.Of(own), slices.Min(d.Runs)

	// The baseline: one node, connect + fence.ReadSchemas of the same
	// tables (what Diff does on each node, in parallel).
	var one, read []float64
	for range *diffRuns {
		start := time.Now()
		c, err := dbnode.Connect(ctx, b.nodes[0])
		if err != nil {
			return d, err
		}
		rs := time.Now()
		ts, err := fence.ReadSchemas(ctx, c, b.tables)
		now := time.Now()
		c.Close(context.Background())
		if err != nil {
			return d, err
		}
		if len(ts) != len(b.tables) {
			return d, fmt.Errorf("fence.ReadSchemas read %d tables, want %d", len(ts), len(b.tables))
		}
		one = append(one, benchkit.MS(now.Sub(start)))
		read = append(read, benchkit.MS(now.Sub(rs)))
	}
	d.OneNodeMS, d.OneNodeRead, d.OneNodeMinMS = benchkit.Of(one), benchkit.Of(read), slices.Min(one)
	d.Ratio = jsonRatio(d.MS.P50, d.OneNodeMS.P50)
	d.GoalMet = d.MS.Max < diffGoalMS && d.Unreachable == 0 && d.Differences == 0
	return d, nil
}

// jsonRatio is x/base, 0 when base is 0: JSON has no NaN (the report
// prints such a ratio as n/a).
func jsonRatio(x, base float64) float64 {
	if base == 0 {
		return 0
	}
	return x / base
}
