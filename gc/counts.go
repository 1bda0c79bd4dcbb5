package gc

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/topo"
)

// Reading the nodes: counting a table's rows in many ranges in one round
// trip and one snapshot, with the fence read in the same snapshot.

func tableRec(tables []topo.TableRecord, name string) topo.TableRecord {
	for _, t := range tables {
		if t.Name == name {
			return t
		}
	}
	return topo.TableRecord{}
}

func qualified(t topo.TableRecord) string {
	return pgx.Identifier{t.Schema(), t.Table()}.Sanitize()
}

// countRanges counts each table's rows in every key range lo[i]..hi[i],
// in one round trip and one snapshot: a read-only transaction holding one
// statement per table (per rangesPerStatement ranges) that counts every
// range, a UNION ALL of one count per range with its bounds as constants,
// so that each count gets the plan today's single-range count would get.
// It runs without parallel workers: GC is background work, and its counts
// should not take the node's parallel-worker slots from the application's
// queries (it also counts on several nodes at once; on machines that share
// cores, parallel workers on both only fight each other). A table missing
// on the node aborts the transaction; the tables are then counted one
// transaction each, so that each gets its own answer (errs).
func countRanges(ctx context.Context, c *pgx.Conn, tables []topo.TableRecord, lo, hi []int64) (counts map[string][]int64, errs map[string]error) {
	counts, err := countTables(ctx, c, tables, lo, hi)
	if err == nil || !isUndefinedTable(err) || len(tables) == 1 {
		if err != nil {
			errs = map[string]error{}
			for _, t := range tables {
				errs[t.Name] = err
			}
		}
		return counts, errs
	}
	counts, errs = map[string][]int64{}, map[string]error{}
	for _, t := range tables {
		one, err := countTables(ctx, c, []topo.TableRecord{t}, lo, hi)
		if err != nil {
			errs[t.Name] = err
			continue
		}
		counts[t.Name] = one[t.Name]
	}
	return counts, errs
}

// readNode reads a node's fence and counts each table's rows in every key
// range lo[i]..hi[i], in one round trip and one snapshot (a REPEATABLE READ
// read-only transaction): the fence's meta row and ownership rows, then
// countTables' statements. Any error (a node without a fence, or without
// one of the tables, fails the whole transaction) is returned as is; the
// caller then asks again one step at a time.
func readNode(ctx context.Context, c *pgx.Conn, tables []topo.TableRecord, lo, hi []int64) (*fence.Fence, map[string][]int64, error) {
	f := &fence.Fence{}
	b := &pgx.Batch{}
	b.Queue(`BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`)
	b.Queue(`SET LOCAL max_parallel_workers_per_gather = 0`)
	b.Queue(`SELECT fence_version, cluster, node, map_version, level, updated_at FROM shardvisor.fence_meta`).QueryRow(func(r pgx.Row) error {
		var mv int64
		err := r.Scan(&f.FenceVersion, &f.Cluster, &f.Node, &mv, &f.Level, &f.UpdatedAt)
		f.MapVersion = uint64(mv)
		return err
	})
	b.Queue(`SELECT lo, hi, state, epoch FROM shardvisor.ownership ORDER BY lo`).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var sp fence.Span
			var st string
			var ep int64
			if err := rows.Scan(&sp.Lo, &sp.Hi, &st, &ep); err != nil {
				return err
			}
			sp.State, sp.Epoch = fence.State(st), uint64(ep)
			f.Spans = append(f.Spans, sp)
		}
		return rows.Err()
	})
	counts := queueCounts(b, tables, lo, hi)
	b.Queue(`COMMIT`)
	if err := sendTx(ctx, c, b); err != nil {
		return nil, nil, err
	}
	return f, counts, nil
}

// rangesPerStatement bounds one count statement's length.
const rangesPerStatement = 256

func countTables(ctx context.Context, c *pgx.Conn, tables []topo.TableRecord, lo, hi []int64) (map[string][]int64, error) {
	b := &pgx.Batch{}
	b.Queue(`BEGIN READ ONLY`)
	b.Queue(`SET LOCAL max_parallel_workers_per_gather = 0`)
	out := queueCounts(b, tables, lo, hi)
	b.Queue(`COMMIT`)
	if err := sendTx(ctx, c, b); err != nil {
		return nil, err
	}
	return out, nil
}

// queueCounts queues on b one statement per table (per rangesPerStatement
// ranges) counting its rows in every range; the counts land in the result
// when b has run.
func queueCounts(b *pgx.Batch, tables []topo.TableRecord, lo, hi []int64) map[string][]int64 {
	out := map[string][]int64{}
	for _, t := range tables {
		n := make([]int64, len(lo))
		out[t.Name] = n
		col := pgx.Identifier{t.KeyColumn}.Sanitize()
		for from := 0; from < len(lo); from += rangesPerStatement {
			to := min(from+rangesPerStatement, len(lo))
			var parts []string
			for i := from; i < to; i++ {
				parts = append(parts, fmt.Sprintf(`SELECT %d AS i, count(*) AS n FROM %s WHERE %s BETWEEN %d AND %d`, i, qualified(t), col, lo[i], hi[i]))
			}
			b.Queue(strings.Join(parts, " UNION ALL ")).Query(func(rows pgx.Rows) error {
				for rows.Next() {
					var i int
					var c int64
					if err := rows.Scan(&i, &c); err != nil {
						return err
					}
					n[i] = c
				}
				return rows.Err()
			})
		}
	}
	return out
}

// sendTx sends b, a BEGIN ... COMMIT batch, in one round trip. After a
// failure it rolls back, bounded by 5 s even when ctx is done: a failed
// statement leaves the transaction open on the connection otherwise (a
// broken connection takes it with it).
func sendTx(ctx context.Context, c *pgx.Conn, b *pgx.Batch) error {
	err := c.SendBatch(ctx, b).Close()
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		c.Exec(rctx, `ROLLBACK`)
		cancel()
	}
	return err
}
