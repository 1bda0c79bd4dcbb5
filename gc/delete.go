package gc

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/topo"
)

type deleter struct {
	g     *GC
	rep   *Report
	start time.Time
	conns *connCache
	extra map[bucketmap.NodeID][]*pgx.Conn // more connections per node, for Parallel
	// hasFence: whether each node has the fence installed (asked once).
	hasFence map[bucketmap.NodeID]bool

	mu      sync.Mutex // guards rep, the walks' TableWork and cursors, and what follows
	lastLog time.Time
	active  int       // batch transactions open now
	since   time.Time // when active last rose from 0
}

// begin and end bracket a batch transaction; Report.Deleting adds up the
// time at least one was open, so it stays wall-clock time with Parallel.
func (d *deleter) begin() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	if d.active == 0 {
		d.since = now
	}
	d.active++
	return now
}

// end is called with d.mu held.
func (d *deleter) end() {
	if d.active--; d.active == 0 {
		d.rep.Deleting += time.Since(d.since)
	}
}

// connsFor returns the connections to delete on a node with: the run's
// own and up to Parallel-1 more, opened once per run. A node that refuses
// the extra ones is deleted on with fewer.
func (d *deleter) connsFor(ctx context.Context, id bucketmap.NodeID, conn *pgx.Conn) []*pgx.Conn {
	if d.extra == nil {
		d.extra = map[bucketmap.NodeID][]*pgx.Conn{}
	}
	more, ok := d.extra[id]
	if !ok {
		n, _ := d.conns.m.Node(id)
		for len(more) < d.g.Opt.Parallel-1 {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			c, err := d.g.Opt.Connect(cctx, n)
			cancel()
			if err != nil {
				d.g.Opt.Logger.Warn("gc: an extra connection failed; deleting with fewer", zap.String("node", string(id)), zap.Int("connections", len(more)+1), zap.Error(err))
				break
			}
			more = append(more, c)
		}
		d.extra[id] = more
	}
	return append([]*pgx.Conn{conn}, more...)
}

// fenced says whether a node has the fence installed, asked once per node
// and run (the walk's batches re-check the node's claims themselves).
func (d *deleter) fenced(ctx context.Context, id bucketmap.NodeID, conn *pgx.Conn) (bool, error) {
	if ok, seen := d.hasFence[id]; seen {
		return ok, nil
	}
	ok, err := fence.Installed(ctx, conn)
	if err != nil {
		return false, err
	}
	if d.hasFence == nil {
		d.hasFence = map[bucketmap.NodeID]bool{}
	}
	d.hasFence[id] = ok
	return ok, nil
}

func (d *deleter) close() {
	for _, cs := range d.extra {
		for _, c := range cs {
			c.Close(context.Background())
		}
	}
}

// errClaimed means the node's fence started claiming a range while GC was
// deleting it (a move towards the node began).
type errClaimed struct{ state string }

func (e *errClaimed) Error() string { return "the node's fence now has part of the range " + e.state }

// delete removes one verified range's leftovers, table by table, in short
// batch transactions. Batches walk the rows in one of two orders, chosen
// per table by sampling where the range's rows sit (see chooseOrder):
//
//   - key order: consecutive key sub-ranges of about Batch rows, each one
//     range delete through the key index. Best when the range's rows sit
//     together in the table, or are few.
//   - heap order: consecutive runs of table pages, deleting the range's rows
//     on them. Best when the rows are spread over the whole table (rows of
//     many buckets written over time, interleaved): key-order batches would
//     then visit every page once per batch, heap-order ones visit each page
//     once, as a plain DELETE does.
//
// Both stop at a batch boundary, so a killed run loses at most one batch's
// work, and the next run recomputes what is left.
func (d *deleter) delete(ctx context.Context, w *Work) error {
	g := d.g
	conn, err := d.conns.get(ctx, w.Node)
	if err != nil {
		return err
	}
	hasFence, err := d.fenced(ctx, w.Node, conn)
	if err != nil {
		return err
	}
	w.Done = false
	for i := range w.Tables {
		tw := &w.Tables[i]
		if tw.Rows == 0 {
			continue
		}
		t := tableRec(g.Tables, tw.Table)
		conns := []*pgx.Conn{conn}
		if g.Opt.Parallel > 1 && tw.Rows > int64(g.Opt.Batch) {
			conns = d.connsFor(ctx, w.Node, conn)
		}
		wk, err := chooseOrder(ctx, conn, t, w, tw.Rows, g.Opt.Batch, g.Opt.Order)
		if err != nil {
			return fmt.Errorf("gc: sizing up %s on %s: %w", tw.Table, w.Node, err)
		}
		stop := false
		if wk.heap {
			tw.Order = "heap"
			stop, err = d.walkHeap(ctx, conns, hasFence, w, tw, t, wk)
			// Rows of the range cannot be added or moved while GC runs
			// (the fence rejects writes; replication apply needs a move
			// towards the node, which every batch checks for), so the
			// pages that existed at the start held them all. Only a table
			// rewrite (VACUUM FULL, CLUSTER, pg_repack) between two
			// batches could move rows behind the walk: the key-order pass
			// below catches those, and costs nothing otherwise.
			if err == nil && !stop && tw.Deleted < tw.Rows {
				g.Opt.Logger.Info("gc: rows left after the heap walk; finishing in key order", zap.String("table", tw.Table), zap.String("range", w.Range.String()), zap.Int64("left", tw.Rows-tw.Deleted))
				// Batches sized for the whole range, not for the few rows
				// left: one DELETE over the whole range would be a long
				// transaction walking every dead index entry.
				stop, err = d.walkKeys(ctx, conns, hasFence, w, tw, t, tw.Rows)
			}
		} else {
			tw.Order = "key"
			stop, err = d.walkKeys(ctx, conns, hasFence, w, tw, t, tw.Rows)
		}
		if err != nil {
			return fmt.Errorf("gc: deleting %s on %s (%s): %w", tw.Table, w.Node, w.Range, err)
		}
		if stop {
			return nil
		}
		// No recount in key order: the batches covered lo..hi, each
		// deleting every row of its sub-range, and only replication apply
		// could add rows here afterwards, which needs a move towards this
		// node, which marks its fence first, which every batch checks.
	}
	w.Done = true
	return nil
}

// walk is how a table's rows of a range are to be walked.
type walk struct {
	heap    bool
	blocks  int64 // the table's pages when the walk was chosen
	perPage int64 // live tuples per page, at most (heap batches are capped by it)
}

// chooseOrder decides between key-order and heap-order batches for a
// table's leftover rows, by comparing the pages each would visit. Heap
// order reads every page of the table once, in physical order. Key order
// reads, per batch, the pages its rows are on: GC measures that on a
// sample (the first 2,000 rows' key sub-range: how many distinct pages
// they sit on) rather than trusting statistics, which may be missing or
// stale. Sequential reads are cheaper, hence the 1.25 in heap order's
// favour. Heap order needs TID range scans (PostgreSQL 14); a sample that
// fails (a statement timeout, say) means key order.
func chooseOrder(ctx context.Context, conn *pgx.Conn, t topo.TableRecord, w *Work, rows int64, batch int, force string) (walk, error) {
	var wk walk
	// A range of at most sampleRows rows is its own sample: one key-order
	// batch reads no more pages than the sample would, so sizing it up
	// (three more statements) would cost as much as deleting it.
	if force == OrderAuto && rows <= sampleRows {
		return wk, nil
	}
	var version int
	var reltuples float64
	var relpages int64
	var kind string
	err := conn.QueryRow(ctx, `SELECT pg_catalog.pg_relation_size(c.oid) / current_setting('block_size')::int, current_setting('server_version_num')::int, c.reltuples, c.relpages, c.relkind::text
FROM pg_catalog.pg_class c WHERE c.oid = $1::regclass`, qualified(t)).Scan(&wk.blocks, &version, &reltuples, &relpages, &kind)
	// A partitioned table has no pages of its own (its partitions have
	// them): key order, through the parent, which prunes to the
	// partitions that may hold the range.
	if err != nil || force == OrderKey || version < 140000 || kind == "p" {
		return wk, err
	}
	// Tuples per page: the statistics' figure or the first pages' count,
	// whichever is larger (a range packed into one region of the table
	// may have every tuple there).
	var first int64
	k := min(wk.blocks, 32)
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+qualified(t)+` WHERE ctid >= '(0,0)'::tid AND ctid < $1`, pgtype.TID{BlockNumber: uint32(k), Valid: true}).Scan(&first); err != nil {
		return wk, err
	}
	wk.perPage = max(first/max(k, 1), 1)
	if reltuples > 0 && relpages > 0 {
		wk.perPage = max(wk.perPage, int64(reltuples/float64(relpages)+0.5))
	}
	if force == OrderHeap {
		wk.heap = true
		return wk, nil
	}
	// A sample of at most 2,000 rows keeps this cheap (on a spread-out
	// table a whole batch's rows would touch most of its pages); it
	// overstates the key walk's visits only where rows are spread out
	// densely, where heap order is right anyway.
	lo, hi := firstBatch(w.KeyLo, w.KeyHi, rows, min(batch, sampleRows))
	var sampled, pages int64
	err = conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT (ctid::text::point)[0]) FROM `+qualified(t)+` WHERE `+pgx.Identifier{t.KeyColumn}.Sanitize()+` BETWEEN $1 AND $2`, lo, hi).Scan(&sampled, &pages)
	if err != nil {
		if ctx.Err() != nil {
			return wk, err
		}
		return wk, nil // key order: it never reads more than the range's rows
	}
	wk.heap = heapOrder(rows, wk.blocks, sampled, pages)
	return wk, nil
}

// sampleRows is the most rows chooseOrder samples.
const sampleRows = 2000

// heapOrder is chooseOrder's rule: the key walk visits about pages/sampled
// pages per row.
func heapOrder(rows, blocks, sampled, pages int64) bool {
	if rows <= 0 || blocks <= 0 || sampled <= 0 {
		return false
	}
	keyVisits := float64(rows) * float64(pages) / float64(sampled)
	return float64(blocks) <= 1.25*keyVisits
}

// firstBatch is the key sub-range of a key walk's first batch: keys are
// hashes, so rows spread evenly over the range, and a sub-range of width
// span*batch/rows holds about batch of them.
func firstBatch(lo, hi, rows int64, batch int) (int64, int64) {
	return lo, batchEnd(lo, hi, batchWidth(lo, hi, rows, batch))
}

// batchWidth is how many keys a batch covers; 0 means all that are left
// (a range of few rows is one batch, also the whole key space, whose key
// count does not fit in a uint64).
func batchWidth(lo, hi, rows int64, batch int) uint64 {
	if rows <= int64(batch) {
		return 0
	}
	span := uint64(hi - lo) // wraps to the right unsigned width
	return max(uint64(float64(span)/(float64(rows)/float64(batch))), 1)
}

// batchEnd is the last key of a batch of width keys starting at cur.
func batchEnd(cur, hi int64, width uint64) int64 {
	if width == 0 || uint64(hi-cur) < width {
		return hi
	}
	return cur + int64(width-1)
}

// walkKeys deletes a table's rows of the range in consecutive key
// sub-ranges, each sized to hold about Batch rows (see firstBatch), the
// width adapting when a batch comes out too large or too small. Each batch is one plain range delete
// that PostgreSQL serves with a bitmap scan of the key index. It returns
// stop when a move towards the node claimed the range.
func (d *deleter) walkKeys(ctx context.Context, conns []*pgx.Conn, hasFence bool, w *Work, tw *TableWork, t topo.TableRecord, rows int64) (stop bool, err error) {
	g := d.g
	del := `DELETE FROM ` + qualified(t) + ` WHERE ` + pgx.Identifier{t.KeyColumn}.Sanitize() + ` BETWEEN $1 AND $2`
	if hasFence {
		del += ` AND ` + unclaimed
	}
	span := uint64(w.KeyHi - w.KeyLo)
	width := batchWidth(w.KeyLo, w.KeyHi, max(rows, 1), g.Opt.Batch)
	cur, finished := w.KeyLo, false
	next := func() ([]any, []int32, bool) {
		if finished {
			return nil, nil, false
		}
		end := batchEnd(cur, w.KeyHi, width)
		args, gran := []any{cur, end}, granules(cur, end)
		if end == w.KeyHi {
			finished = true
		} else {
			cur = end + 1
		}
		return args, gran, true
	}
	adapt := func(n int64) {
		switch {
		case width == 0:
		case n > 2*int64(g.Opt.Batch) && width > 1:
			width /= 2
		case n < int64(g.Opt.Batch)/2 && width < span/2:
			width *= 2
		}
	}
	return d.walk(ctx, conns, hasFence, w, tw, false, del, next, adapt)
}

// walkHeap deletes a table's rows of the range page run by page run, in
// physical order (a TID range scan per batch), over the pages the table had
// when GC chose the order. Each run is sized to hold about Batch of the
// range's rows, and never more pages than could hold 2*Batch tuples of
// any kind: the range's rows may be packed into one region of the table
// (a bucket copied in, then moved away), where every tuple is one of them.
func (d *deleter) walkHeap(ctx context.Context, conns []*pgx.Conn, hasFence bool, w *Work, tw *TableWork, t topo.TableRecord, wk walk) (stop bool, err error) {
	blocks := wk.blocks
	g := d.g
	del := `DELETE FROM ` + qualified(t) + ` WHERE ctid >= $3 AND ctid < $4 AND ` + pgx.Identifier{t.KeyColumn}.Sanitize() + ` BETWEEN $1 AND $2`
	if hasFence {
		del += ` AND ` + unclaimed
	}
	gran := granules(w.KeyLo, w.KeyHi) // a page run may hold any key of the range
	most := max(2*int64(g.Opt.Batch)/max(wk.perPage, 1), 1)
	step := min(max(int64(float64(g.Opt.Batch)*float64(blocks)/float64(tw.Rows)), 1), most)
	p := int64(0)
	next := func() ([]any, []int32, bool) {
		if p >= blocks {
			return nil, nil, false
		}
		end := min(p+step, blocks)
		args := []any{w.KeyLo, w.KeyHi, pgtype.TID{BlockNumber: uint32(p), Valid: true}, pgtype.TID{BlockNumber: uint32(end), Valid: true}}
		p = end
		return args, gran, true
	}
	adapt := func(n int64) {
		switch {
		case n > 2*int64(g.Opt.Batch) && step > 1:
			step /= 2
		case n < int64(g.Opt.Batch)/2 && step < most:
			step = min(2*step, most)
		}
	}
	return d.walk(ctx, conns, hasFence, w, tw, true, del, next, adapt)
}

// walk runs a walk's batches on every connection of conns at once, each
// taking the next batch from next and reporting its row count to adapt
// (both called under d.mu, so a walk's cursor needs no lock of its own).
// The first error or claim stops every connection after its current
// batch. Batches on different connections are independent: each one is
// its own transaction with its own claim check, and the lock granules are
// taken shared, so concurrent batches never wait for each other.
func (d *deleter) walk(ctx context.Context, conns []*pgx.Conn, hasFence bool, w *Work, tw *TableWork, heap bool, del string,
	next func() ([]any, []int32, bool), adapt func(n int64)) (stop bool, err error) {
	var (
		wg       sync.WaitGroup
		firstErr error
		halted   bool
	)
	for _, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				d.mu.Lock()
				var (
					args []any
					gran []int32
					ok   bool
				)
				if !halted {
					args, gran, ok = next()
				}
				d.mu.Unlock()
				if !ok {
					return
				}
				n, err := d.batch(ctx, conn, hasFence, w, tw, gran, heap, del, args...)
				if err == nil {
					err = d.throttle(ctx)
				}
				d.mu.Lock()
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					halted = true
				} else {
					adapt(n)
				}
				d.mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return d.stopped(w, tw, firstErr)
	}
	return false, nil
}

// unclaimed guards every delete: a range the node's fence claims (a move
// towards it started) deletes nothing. Uncorrelated, so PostgreSQL checks
// it once per statement.
const unclaimed = `NOT EXISTS (SELECT FROM shardvisor.ownership WHERE lo <= $2 AND hi >= $1)`

// stopped turns a batch error into walk's result: a claimed range stops the
// range (reported as skipped), anything else fails the run.
func (d *deleter) stopped(w *Work, tw *TableWork, err error) (bool, error) {
	claimed, ok := err.(*errClaimed)
	if !ok {
		return false, err
	}
	d.rep.Skipped = append(d.rep.Skipped, Skip{Range: w.Range, Kind: SkipMove, Reason: fmt.Sprintf("stopped after deleting %d rows of %s: %v (a move towards %s started?)", tw.Deleted, tw.Table, claimed, w.Node)})
	d.g.Opt.Logger.Warn("gc: stopped a range", zap.String("range", w.Range.String()), zap.Error(err))
	return true, nil
}

func granules(lo, hi int64) []int32 {
	var out []int32
	for g := fence.Granule(lo); g <= fence.Granule(hi); g++ {
		out = append(out, g)
	}
	return out
}

// batch runs one delete transaction, in one round trip: bypass the fence
// trigger, take the batch's lock granules shared (so that a flip handing
// the range to this node waits for the batch, and the next batch sees
// it), then delete unless the node's fence claims the range, and account
// for it.
func (d *deleter) batch(ctx context.Context, conn *pgx.Conn, hasFence bool, w *Work, tw *TableWork, gran []int32, heap bool, del string, args ...any) (n int64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	t0 := d.begin()
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SET LOCAL session_replication_role = replica`)
	if heap {
		// The planner would rather walk the key index for a narrow key
		// range; the point of a heap walk is not to.
		b.Queue(`SET LOCAL enable_indexscan = off`)
		b.Queue(`SET LOCAL enable_bitmapscan = off`)
	}
	var claimed *string
	if hasFence {
		b.Queue(`SELECT pg_catalog.pg_advisory_xact_lock_shared($1, g) FROM unnest($2::int4[]) WITH ORDINALITY AS u(g, i) ORDER BY i`, fence.LockClass, gran)
	}
	b.Queue(del, args...).Exec(func(ct pgconn.CommandTag) error { n = ct.RowsAffected(); return nil })
	if hasFence {
		// After the delete, with a later snapshot: a claim only ever
		// appears, so one that kept the delete's guard from deleting is
		// seen here too, and the range stops instead of counting as done.
		b.Queue(`SELECT (SELECT state FROM shardvisor.ownership WHERE lo <= $2 AND hi >= $1 LIMIT 1)`, args[0], args[1]).QueryRow(func(r pgx.Row) error { return r.Scan(&claimed) })
	}
	b.Queue(`COMMIT`)
	if err = sendTx(ctx, conn, b); err != nil {
		if strings.Contains(err.Error(), "session_replication_role") {
			err = fmt.Errorf("bypassing the fence needs superuser or SET on session_replication_role: %w", err)
		}
		d.mu.Lock()
		d.end()
		d.mu.Unlock()
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.end()
	dur := time.Since(t0)
	tw.Deleted += n
	d.rep.Deleted += n
	d.rep.Batches++
	d.rep.MaxBatch = max(d.rep.MaxBatch, dur)
	d.g.Opt.Metrics.batch(string(w.Node), tw.Table, n, dur, d.rep.Rows-d.rep.Deleted)
	d.progress(w, tw.Table)
	if claimed != nil {
		return n, &errClaimed{*claimed}
	}
	return n, nil
}

// throttle sleeps so that the run's average stays under Rate rows/s.
func (d *deleter) throttle(ctx context.Context) error {
	if d.g.Opt.Rate <= 0 {
		return nil
	}
	d.mu.Lock()
	due := d.start.Add(time.Duration(float64(d.rep.Deleted) / d.g.Opt.Rate * float64(time.Second)))
	d.mu.Unlock()
	if wait := time.Until(due); wait > 0 {
		return backoff.Sleep(ctx, wait)
	}
	return nil
}

func (d *deleter) progress(w *Work, table string) {
	p := Progress{Node: w.Node, Table: table, Range: w.Range.String(), Deleted: d.rep.Deleted, Total: d.rep.Rows,
		Batches: d.rep.Batches, Elapsed: time.Since(d.start), MaxBatch: d.rep.MaxBatch}
	if d.g.Opt.Progress != nil {
		p.Message = fmt.Sprintf("%s %s %s: %d of %d rows deleted, %d batches", p.Node, p.Table, p.Range, p.Deleted, p.Total, p.Batches)
		d.g.Opt.Progress(p)
	}
	if time.Since(d.lastLog) >= 5*time.Second {
		d.lastLog = time.Now()
		d.g.Opt.Logger.Info("gc: progress", zap.String("node", string(w.Node)), zap.String("table", table), zap.String("range", p.Range),
			zap.Int64("deleted", p.Deleted), zap.Int64("total", p.Total), zap.Int("batches", p.Batches),
			zap.Float64("rows_per_s", float64(p.Deleted)/max(p.Elapsed.Seconds(), 1e-9)))
	}
}
