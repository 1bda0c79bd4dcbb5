package gc

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/fence"
)

type deleter struct {
	g       *GC
	rep     *Report
	start   time.Time
	conns   *connCache
	lastLog time.Time
}

// errClaimed means the node's fence started claiming a range while GC was
// deleting it (a move towards the node began).
type errClaimed struct{ state string }

func (e *errClaimed) Error() string { return "the node's fence now has part of the range " + e.state }

// delete removes one verified range's leftovers, table by table, in
// key-order batches.
func (d *deleter) delete(ctx context.Context, w *Work) error {
	g := d.g
	conn, err := d.conns.get(ctx, w.Node)
	if err != nil {
		return err
	}
	hasFence, err := fence.Installed(ctx, conn)
	if err != nil {
		return err
	}
	w.Done = true
	for i := range w.Tables {
		tw := &w.Tables[i]
		if tw.Rows == 0 {
			continue
		}
		t := tableRec(g.Tables, tw.Table)
		col := pgx.Identifier{t.KeyColumn}.Sanitize()
		var del string
		if hasFence {
			// The fence check is part of the delete: a range the node's
			// fence claims (a move towards it started) deletes nothing.
			del = `WITH claimed AS (SELECT state FROM shardvisor.ownership WHERE lo <= $2 AND hi >= $1 LIMIT 1),
d AS (DELETE FROM ` + qualified(t) + ` WHERE ` + col + ` BETWEEN $1 AND $2 AND NOT EXISTS (SELECT FROM claimed) RETURNING 1)
SELECT (SELECT count(*) FROM d), (SELECT state FROM claimed)`
		} else {
			del = `WITH d AS (DELETE FROM ` + qualified(t) + ` WHERE ` + col + ` BETWEEN $1 AND $2 RETURNING 1) SELECT count(*), NULL::text FROM d`
		}
		// Batches are consecutive key sub-ranges, each sized to hold about
		// Batch rows: keys are hashes, so rows spread evenly over the
		// range, and the width adapts when a batch comes out too large or
		// too small. Each batch is then one plain range delete that
		// PostgreSQL can serve with a bitmap scan, instead of a row-by-row
		// walk.
		span := uint64(w.KeyHi - w.KeyLo) // wraps to the right unsigned width
		width := span
		if tw.Rows > int64(g.Opt.Batch) {
			width = uint64(float64(span) / (float64(tw.Rows) / float64(g.Opt.Batch)))
		}
		width = max(width, 1)
		cur := w.KeyLo
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			end := w.KeyHi
			if uint64(w.KeyHi-cur) > width-1 {
				end = cur + int64(width-1)
			}
			n, dur, err := d.batch(ctx, conn, hasFence, del, cur, end)
			if claimed, ok := err.(*errClaimed); ok {
				w.Done = false
				d.rep.Skipped = append(d.rep.Skipped, Skip{Range: w.Range, Kind: SkipMove, Reason: fmt.Sprintf("stopped after deleting %d rows of %s: %v (a move towards %s started?)", tw.Deleted, tw.Table, claimed, w.Node)})
				g.Opt.Log.Warn("gc: stopped a range", zap.String("range", w.Range.String()), zap.Error(err))
				return nil
			}
			if err != nil {
				return fmt.Errorf("gc: deleting %s on %s (%s): %w", tw.Table, w.Node, w.Range, err)
			}
			tw.Deleted += n
			d.rep.Deleted += n
			d.rep.Batches++
			d.rep.MaxBatch = max(d.rep.MaxBatch, dur)
			g.Opt.Metrics.batch(string(w.Node), tw.Table, n, dur, d.rep.Rows-d.rep.Deleted)
			d.progress(w, tw.Table)
			if end == w.KeyHi {
				break
			}
			cur = end + 1
			switch {
			case n > 2*int64(g.Opt.Batch) && width > 1:
				width /= 2
			case n < int64(g.Opt.Batch)/2 && width < span/2:
				width *= 2
			}
			if err := d.throttle(ctx); err != nil {
				return err
			}
		}
		// No recount: the batches covered lo..hi, each deleting every row
		// of its sub-range, and only replication apply could add rows here
		// afterwards, which needs a move towards this node, which marks its
		// fence first, which every batch checks.
	}
	return nil
}

// batch runs one delete transaction, in one round trip: bypass the fence
// trigger, take the batch's lock granules shared (so that a flip handing
// the range to this node waits for the batch, and the next batch sees
// it), then delete unless the node's fence claims the range.
func (d *deleter) batch(ctx context.Context, conn *pgx.Conn, hasFence bool, del string, lo, hi int64) (n int64, dur time.Duration, err error) {
	t0 := time.Now()
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SET LOCAL session_replication_role = replica`)
	if hasFence {
		var gran []int32
		for g := fence.Granule(lo); g <= fence.Granule(hi); g++ {
			gran = append(gran, g)
		}
		b.Queue(`SELECT pg_catalog.pg_advisory_xact_lock_shared($1, g) FROM unnest($2::int4[]) WITH ORDINALITY AS u(g, i) ORDER BY i`, fence.LockClass, gran)
	}
	var claimed *string
	b.Queue(del, lo, hi).QueryRow(func(r pgx.Row) error { return r.Scan(&n, &claimed) })
	b.Queue(`COMMIT`)
	err = conn.SendBatch(ctx, b).Close()
	if err != nil {
		// A failed statement aborts the transaction; COMMIT then rolls it
		// back, and a broken connection takes it with it.
		conn.Exec(context.WithoutCancel(ctx), `ROLLBACK`)
		if strings.Contains(err.Error(), "session_replication_role") {
			err = fmt.Errorf("bypassing the fence needs superuser or SET on session_replication_role: %w", err)
		}
		return 0, 0, err
	}
	if claimed != nil {
		return 0, 0, &errClaimed{*claimed}
	}
	return n, time.Since(t0), nil
}

// throttle sleeps so that the run's average stays under Rate rows/s.
func (d *deleter) throttle(ctx context.Context) error {
	if d.g.Opt.Rate <= 0 {
		return nil
	}
	due := d.start.Add(time.Duration(float64(d.rep.Deleted) / d.g.Opt.Rate * float64(time.Second)))
	wait := time.Until(due)
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (d *deleter) progress(w *Work, table string) {
	p := Progress{Node: w.Node, Table: table, Range: w.Range.String(), Deleted: d.rep.Deleted, Total: d.rep.Rows,
		Batches: d.rep.Batches, Elapsed: time.Since(d.start), MaxBatch: d.rep.MaxBatch}
	if d.g.Opt.Progress != nil {
		d.g.Opt.Progress(p)
	}
	if time.Since(d.lastLog) >= 5*time.Second {
		d.lastLog = time.Now()
		d.g.Opt.Log.Info("gc: progress", zap.String("node", string(w.Node)), zap.String("table", table), zap.String("range", p.Range),
			zap.Int64("deleted", p.Deleted), zap.Int64("total", p.Total), zap.Int("batches", p.Batches),
			zap.Float64("rows_per_s", float64(p.Deleted)/max(p.Elapsed.Seconds(), 1e-9)))
	}
}
