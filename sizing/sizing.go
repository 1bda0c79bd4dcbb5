// Package sizing measures how much data each bucket holds on its owner:
// rows and bytes of every sharded table, per directory slot of the map,
// then finer inside the largest buckets, so that the planner by size
// (bucketmap.PlanBySize) knows what a split would leave in each half.
//
// Rows are counted exactly on a table whose statistics say it is small
// (pg_class.reltuples under Options.ExactBelow), and estimated from a
// TABLESAMPLE SYSTEM sample of its pages otherwise: the sample's count
// per slot divided by the fraction of pages read. Bytes are the live
// rows' own bytes (the sum of pg_column_size of each row), counted or
// estimated with the rows: what a user means by size, the same whether a
// node was filled by INSERT or by a move's COPY. The table's size on disk
// is no measure of that: a btree filled in key order packs its pages, one
// that took a range below its other keys splits them half full, and dead
// rows, free space and leftovers all take room (a node that kept its
// inserted rows measured 84 B a row on disk, nodes filled by copies 105).
// So the disk size (pg_total_relation_size), the dead rows by the
// statistics and the leftovers are reported apart, for the operator; the
// planner balances live bytes. Every figure is as of the measurement; the
// statistics only choose the method.
package sizing

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/topo"
)

// Options tune a measurement.
type Options struct {
	// ExactBelow: a table with fewer rows than this, by its statistics,
	// is counted exactly (default 2,000,000; negative: always exact).
	ExactBelow int64
	// SampleRows is about how many rows a sample reads (default 200,000).
	SampleRows int64
	// RefineTop: the largest buckets measured finer (default 16).
	RefineTop int
	// RefineDepth: how many levels deeper they are measured (default 8,
	// never past bucketmap.MaxDepth).
	RefineDepth int
	// Parallel: nodes measured at once (default 4).
	Parallel int
	// Connect opens a connection to a node (default dbnode.Connect).
	Connect func(ctx context.Context, n bucketmap.Node) (*pgx.Conn, error)
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	if o.ExactBelow == 0 {
		o.ExactBelow = 2_000_000
	}
	if o.SampleRows <= 0 {
		o.SampleRows = 200_000
	}
	if o.RefineTop <= 0 {
		o.RefineTop = 16
	}
	if o.RefineDepth <= 0 {
		o.RefineDepth = 8
	}
	if o.Parallel <= 0 {
		o.Parallel = 4
	}
	if o.Connect == nil {
		o.Connect = dbnode.Connect
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// TableReport is how one table was measured on one node.
type TableReport struct {
	Table string `json:"table"`
	// Method is "exact", or "sample P%" (TABLESAMPLE SYSTEM of P% of its
	// pages, counts scaled up), or "missing" (no such table there).
	Method string `json:"method"`
	// Rows and Bytes are the table's live rows on the node, owned rows
	// and leftovers alike, and their own bytes.
	Rows  int64 `json:"rows"`
	Bytes int64 `json:"bytes"`
	// Physical is its size on disk (pg_total_relation_size over its
	// partitions: heap, TOAST, indexes, dead rows and free space).
	Physical int64 `json:"physical_bytes"`
	// DeadRows are row versions awaiting vacuum, by the statistics
	// (pg_stat's n_dead_tup: an estimate, as of the last report to it).
	DeadRows int64 `json:"dead_rows"`
}

// NodeReport is one node's part of a measurement.
type NodeReport struct {
	Node   bucketmap.NodeID `json:"node"`
	Tables []TableReport    `json:"tables"`
	// Owned is what it holds in the buckets it owns, live rows and their
	// bytes: what the planner balances. Leftover is what it holds in
	// buckets it does not (copies GC has yet to delete, or rows of a move
	// in flight).
	Owned    bucketmap.Size `json:"owned"`
	Leftover bucketmap.Size `json:"leftover"`
	// Dead is the dead rows by the statistics, and their bytes at the
	// table's mean live row size (estimates both).
	Dead bucketmap.Size `json:"dead"`
	// Physical is the tables' size on disk; what is neither owned,
	// leftover nor dead in it is indexes, page and row overhead and free
	// space.
	Physical int64   `json:"physical_bytes"`
	TookMS   float64 `json:"took_ms"`
}

// BucketSize is one bucket's size on its owner.
type BucketSize struct {
	bucketmap.Bucket
	Name  string           `json:"name"`
	Owner bucketmap.NodeID `json:"owner"`
	bucketmap.Size
}

// Report is one measurement.
type Report struct {
	At         time.Time    `json:"at"`
	MapVersion uint64       `json:"map_version"`
	Nodes      []NodeReport `json:"nodes"`
	// Buckets lists every bucket, largest first (by bytes).
	Buckets []BucketSize `json:"buckets"`
	// Sizes is what the planner reads.
	Sizes *bucketmap.Sizes `json:"-"`
	// Refined names the buckets measured finer, and how deep.
	Refined []bucketmap.Bucket `json:"refined"`
}

// slotSizes is a node's measurement of one table per slot.
type slotSizes map[uint32]bucketmap.Size

// Measure measures every bucket of m on its owner. Every owner must
// answer: a bucket left unmeasured would look empty to the planner, so an
// unreachable node fails the measurement, naming it.
func Measure(ctx context.Context, m *bucketmap.Map, tables []topo.TableRecord, opt Options) (*Report, error) {
	opt = opt.withDefaults()
	if len(tables) == 0 {
		return nil, hint.New(fmt.Errorf("the cluster has no sharded tables: there is nothing to measure"), "shardctl table add")
	}
	start := opt.Now()
	owners := map[bucketmap.NodeID]bool{}
	m.EachBucket(func(b bucketmap.Bucket, lo, _ uint32) bool {
		owners[m.Owner(lo)] = true
		return true
	})
	var ids []bucketmap.NodeID
	for _, n := range m.Nodes() {
		if owners[n.ID] {
			ids = append(ids, n.ID)
		}
	}
	type result struct {
		rep   NodeReport
		slots slotSizes
		err   error
	}
	res := make([]result, len(ids))
	sem := make(chan struct{}, opt.Parallel)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			n, _ := m.Node(id)
			t0 := time.Now()
			rep, slots, err := measureNode(ctx, m, n, tables, opt)
			rep.TookMS = float64(time.Since(t0).Microseconds()) / 1000
			res[i] = result{rep, slots, err}
		}()
	}
	wg.Wait()
	owned := slotSizes{}
	out := &Report{At: start.UTC(), MapVersion: m.Version, Buckets: []BucketSize{}, Refined: []bucketmap.Bucket{}}
	for i, r := range res {
		if r.err != nil {
			return nil, fmt.Errorf("measuring node %s: %w (every owner must answer: a bucket left out would look empty)", ids[i], r.err)
		}
		out.Nodes = append(out.Nodes, r.rep)
		for s, sz := range r.slots {
			owned[s] = sz
		}
	}
	cells := bucketmap.CellsOfSlots(m.Level, owned)
	// The largest buckets, measured finer on their owners.
	var bs []BucketSize
	m.EachBucket(func(b bucketmap.Bucket, lo, hi uint32) bool {
		var sz bucketmap.Size
		for s := lo; s <= hi; s++ {
			sz.Rows += owned[s].Rows
			sz.Bytes += owned[s].Bytes
		}
		bs = append(bs, BucketSize{Bucket: b, Name: m.Name(b), Owner: m.Owner(lo), Size: sz})
		return true
	})
	slices.SortStableFunc(bs, func(a, b BucketSize) int { return cmp.Compare(b.Bytes, a.Bytes) })
	out.Buckets = bs
	for _, b := range bs[:min(opt.RefineTop, len(bs))] {
		if b.Rows == 0 || b.Depth >= bucketmap.MaxDepth {
			continue
		}
		d := min(b.Depth+opt.RefineDepth, bucketmap.MaxDepth)
		n, _ := m.Node(b.Owner)
		finer, err := refine(ctx, n, tables, b.Bucket, b.Rows, d, opt)
		if err != nil {
			return nil, fmt.Errorf("measuring bucket %s on %s: %w", b.Name, b.Owner, err)
		}
		// The finer cells share out the bucket's measured size: the two
		// measurements are minutes apart at most, and the planner needs
		// the parts to add up to the whole.
		scaleTo(finer, b.Size)
		cells = bucketmap.Refine(cells, b.Bucket, finer)
		out.Refined = append(out.Refined, bucketmap.Bucket{Prefix: b.Prefix << (d - b.Depth), Depth: d})
	}
	sz, err := bucketmap.NewSizes(cells, out.At, m.Version)
	if err != nil {
		return nil, err
	}
	out.Sizes = sz
	return out, nil
}

// scaleTo makes cells add up to total, keeping their proportions.
func scaleTo(cells []bucketmap.Cell, total bucketmap.Size) {
	var sum bucketmap.Size
	for _, c := range cells {
		sum.Rows += c.Rows
		sum.Bytes += c.Bytes
	}
	scale := func(v, of, to int64) int64 {
		if of == 0 {
			return 0
		}
		return int64(float64(v) * float64(to) / float64(of))
	}
	for i := range cells {
		cells[i].Rows = scale(cells[i].Rows, sum.Rows, total.Rows)
		cells[i].Bytes = scale(cells[i].Bytes, sum.Bytes, total.Bytes)
	}
}

// tableInfo is what the statistics say about a table on a node.
type tableInfo struct {
	exists   bool
	estRows  int64 // pg_class.reltuples over its partitions; -1: never analyzed
	diskSize int64 // pg_total_relation_size over its partitions
	deadRows int64 // pg_stat_get_dead_tuples over its partitions
}

func info(ctx context.Context, c *pgx.Conn, t topo.TableRecord) (tableInfo, error) {
	var rel *uint32
	if err := c.QueryRow(ctx, `SELECT to_regclass($1)::oid`, qualified(t)).Scan(&rel); err != nil {
		return tableInfo{}, err
	}
	if rel == nil {
		return tableInfo{}, nil
	}
	ti := tableInfo{exists: true}
	// A partitioned table holds nothing itself: its partitions do. A
	// reltuples of -1 means never analyzed (PostgreSQL 14 and later).
	var least, sum int64
	// pg_partition_tree lists nothing for a plain table: it is its own
	// only leaf.
	err := c.QueryRow(ctx, `WITH leaves AS (
			SELECT relid FROM pg_partition_tree($1::oid) WHERE isleaf
			UNION ALL SELECT $1::oid WHERE NOT EXISTS (SELECT 1 FROM pg_partition_tree($1::oid)))
		SELECT coalesce(sum(pg_total_relation_size(l.relid)), 0)::bigint,
			coalesce(min(c.reltuples), -1)::bigint, coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint,
			coalesce(sum(pg_stat_get_dead_tuples(l.relid)), 0)::bigint
		FROM leaves l JOIN pg_class c ON c.oid = l.relid`, *rel).Scan(&ti.diskSize, &least, &sum, &ti.deadRows)
	if err != nil {
		return tableInfo{}, err
	}
	ti.estRows = sum
	if least < 0 {
		ti.estRows = -1
	}
	return ti, nil
}

// method picks exact or a sample's percentage of pages.
func method(ti tableInfo, opt Options) (pct float64) {
	if opt.ExactBelow < 0 || ti.estRows < 0 || ti.estRows < opt.ExactBelow {
		return 100
	}
	return max(0.01, min(100, 100*float64(opt.SampleRows)/float64(ti.estRows)))
}

func sampleClause(pct float64) string {
	if pct >= 100 {
		return ""
	}
	return fmt.Sprintf(" TABLESAMPLE SYSTEM (%g)", pct)
}

func methodName(pct float64) string {
	if pct >= 100 {
		return "exact"
	}
	return fmt.Sprintf("sample %.3g%%", pct)
}

// slotExpr is a key's directory slot at depth d in SQL: the key is the
// prefix with its top bit flipped (keystream.Key), so an arithmetic shift
// plus 2^(d-1) gives the prefix's top d bits.
func slotExpr(col string, d int) string {
	if d == 0 {
		return "0::bigint"
	}
	return fmt.Sprintf("((%s >> %d) + %d)", quoteIdent(col), 64-d, int64(1)<<(d-1))
}

// measureNode measures every table on one node per slot, and keeps the
// slots the node owns.
func measureNode(ctx context.Context, m *bucketmap.Map, n bucketmap.Node, tables []topo.TableRecord, opt Options) (NodeReport, slotSizes, error) {
	rep := NodeReport{Node: n.ID, Tables: []TableReport{}}
	c, err := opt.Connect(ctx, n)
	if err != nil {
		return rep, nil, err
	}
	defer c.Close(context.Background())
	all := slotSizes{}
	for _, t := range tables {
		ti, err := info(ctx, c, t)
		if err != nil {
			return rep, nil, fmt.Errorf("table %s: %w", t.Name, err)
		}
		if !ti.exists {
			rep.Tables = append(rep.Tables, TableReport{Table: t.Name, Method: "missing"})
			continue
		}
		pct := method(ti, opt)
		per, tr, err := measureRange(ctx, c, t, ti, pct, m.Level, nil)
		if err != nil {
			return rep, nil, fmt.Errorf("table %s: %w", t.Name, err)
		}
		rep.Tables = append(rep.Tables, tr)
		rep.Physical += tr.Physical
		rep.Dead.Rows += tr.DeadRows
		if tr.Rows > 0 {
			rep.Dead.Bytes += int64(float64(tr.DeadRows) * float64(tr.Bytes) / float64(tr.Rows))
		}
		for s, sz := range per {
			a := all[s]
			a.Rows += sz.Rows
			a.Bytes += sz.Bytes
			all[s] = a
		}
	}
	owned := slotSizes{}
	for s, sz := range all {
		if m.Owner(s) == n.ID {
			owned[s] = sz
			rep.Owned.Rows += sz.Rows
			rep.Owned.Bytes += sz.Bytes
		} else {
			rep.Leftover.Rows += sz.Rows
			rep.Leftover.Bytes += sz.Bytes
		}
	}
	// Every slot the node owns is measured, empty or not.
	m.EachBucket(func(b bucketmap.Bucket, lo, hi uint32) bool {
		if m.Owner(lo) == n.ID {
			for s := lo; s <= hi; s++ {
				if _, ok := owned[s]; !ok {
					owned[s] = bucketmap.Size{}
				}
			}
		}
		return true
	})
	return rep, owned, nil
}

// measureRange counts one table's rows per slot at depth d (within keys
// lo..hi when within is set) and their bytes, both scaled up from a
// sample alike.
func measureRange(ctx context.Context, c *pgx.Conn, t topo.TableRecord, ti tableInfo, pct float64, d int, within *[2]int64) (slotSizes, TableReport, error) {
	q := fmt.Sprintf(`SELECT %s AS slot, count(*), coalesce(sum(pg_column_size(t.*)), 0)::bigint FROM %s t%s`,
		slotExpr(t.KeyColumn, d), qualified(t), sampleClause(pct))
	var args []any
	if within != nil {
		q += fmt.Sprintf(" WHERE %s BETWEEN $1 AND $2", quoteIdent(t.KeyColumn))
		args = append(args, within[0], within[1])
	}
	q += " GROUP BY 1"
	rows, err := c.Query(ctx, q, args...)
	if err != nil {
		return nil, TableReport{}, err
	}
	scale := 100 / pct
	out := slotSizes{}
	var sumCol, sumRows int64
	for rows.Next() {
		var slot, n, b int64
		if err := rows.Scan(&slot, &n, &b); err != nil {
			rows.Close()
			return nil, TableReport{}, err
		}
		out[uint32(slot)] = bucketmap.Size{Rows: int64(float64(n) * scale), Bytes: int64(float64(b) * scale)}
		sumCol += b
		sumRows += n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, TableReport{}, err
	}
	return out, TableReport{Table: t.Name, Method: methodName(pct), Rows: int64(float64(sumRows) * scale), Bytes: int64(float64(sumCol) * scale),
		Physical: ti.diskSize, DeadRows: ti.deadRows}, nil
}

// refine measures bucket b (about rows rows) on its owner n at depth d:
// one cell per prefix at d, empty ones included. The method depends on the
// bucket's rows, not its table's: a bucket under ExactBelow is counted
// exactly through the key index, a larger one sampled to about SampleRows
// of its own rows, so that its fine cells are not left to a handful of
// sampled rows each.
func refine(ctx context.Context, n bucketmap.Node, tables []topo.TableRecord, b bucketmap.Bucket, rows int64, d int, opt Options) ([]bucketmap.Cell, error) {
	c, err := opt.Connect(ctx, n)
	if err != nil {
		return nil, err
	}
	defer c.Close(context.Background())
	lo, hi := b.Keys()
	sum := slotSizes{}
	for _, t := range tables {
		ti, err := info(ctx, c, t)
		if err != nil {
			return nil, err
		}
		if !ti.exists {
			continue
		}
		per, _, err := measureRange(ctx, c, t, ti, method(tableInfo{estRows: rows}, opt), d, &[2]int64{lo, hi})
		if err != nil {
			return nil, fmt.Errorf("table %s: %w", t.Name, err)
		}
		for s, sz := range per {
			a := sum[s]
			a.Rows += sz.Rows
			a.Bytes += sz.Bytes
			sum[s] = a
		}
	}
	first := b.Prefix << (d - b.Depth)
	out := make([]bucketmap.Cell, 0, 1<<(d-b.Depth))
	for i := range uint32(1) << (d - b.Depth) {
		out = append(out, bucketmap.Cell{Bucket: bucketmap.Bucket{Prefix: first + i, Depth: d}, Size: sum[first+i]})
	}
	return out, nil
}

// quoteIdent and qualified quote identifiers as gc does, with pgx's.
func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

func qualified(t topo.TableRecord) string {
	return pgx.Identifier{t.Schema(), t.Table()}.Sanitize()
}
