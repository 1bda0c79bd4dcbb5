package backup

// One current owner's part of a bucket restore (bucket.go runs them):
// staging the range's rows from the scratch servers, the diff by primary
// key, and the apply in one transaction under the fence's drain locks, the
// bucket's write pause.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/topo"
)

// nodeResult is one current owner's part of a restore.
type nodeResult struct {
	tables                             []TableResult
	staged                             int64
	stageMS, diffMS, pauseMS, waitedMS float64
}

// stagedTable is a table staged on a node.
type stagedTable struct {
	t     topo.TableRecord
	stage string   // the staging table, qualified and quoted
	cols  []string // the columns restored (the live table's that the point had)
	pk    []string // the live table's primary key
	// noSet: identity columns GENERATED ALWAYS outside the key, which an
	// UPDATE may not set (a changed one is left as it is now).
	noSet []string
}

// ownerWork is one current owner's part of a restore: its connection,
// pieces, staged tables and figures.
type ownerWork struct {
	node   bucketmap.Node
	c      *pgx.Conn
	pieces []Piece
	staged []stagedTable
	nr     *nodeResult
}

// close drops the staging tables and closes the connection.
func (w *ownerWork) close(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	for _, s := range w.staged {
		_, _ = w.c.Exec(ctx, `DROP TABLE IF EXISTS `+s.stage)
	}
	w.c.Close(ctx)
}

// prepareOn stages the node's pieces and diffs them. A dry run stops
// after it.
func prepareOn(ctx context.Context, n bucketmap.Node, pieces []Piece, tables []topo.TableRecord, scratch map[string]*Scratch, id string, opt RestoreOptions, say func(string, ...any)) (*ownerWork, error) {
	c, err := dbnode.Connect(ctx, n)
	if err != nil {
		return nil, err
	}
	w := &ownerWork{node: n, c: c, pieces: pieces, nr: &nodeResult{}}
	nr := w.nr
	// The diff and the apply join the staged rows with the live range by
	// primary key. A nested loop is never right for that, and the planner
	// picks one when the live table's statistics say the range is empty
	// (its rows deleted by the mistake, not yet vacuumed): each probe then
	// walks the range's dead tuples, and a million-row bucket took hours.
	if _, err := c.Exec(ctx, `SET enable_nestloop = off`); err != nil {
		return w, err
	}
	if _, err := c.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS shardvisor_restore`); err != nil {
		return w, fmt.Errorf("staging schema: %w", err)
	}
	staging := time.Now()
	for i, t := range tables {
		tr := TableResult{Table: t.Name}
		stg, skipped, err := stageTable(ctx, c, t, fmt.Sprintf("shardvisor_restore.%s", quoteIdent(fmt.Sprintf("r%s_%d", strings.ReplaceAll(id, "-", "_"), i))), pieces, scratch)
		if stg != nil {
			w.staged = append(w.staged, *stg)
		}
		if err != nil {
			return w, fmt.Errorf("%s: staging: %w", t.Name, err)
		}
		if skipped != "" {
			tr.Skipped = skipped
			say("%s: %s", t.Name, skipped)
		}
		nr.tables = append(nr.tables, tr)
	}
	for _, s := range w.staged {
		var rows int64
		if err := c.QueryRow(ctx, `SELECT count(*) FROM `+s.stage).Scan(&rows); err != nil {
			return w, err
		}
		nr.staged += rows
	}
	nr.stageMS = ms(time.Since(staging))
	say("node %s: %d rows staged from the point in %.0f ms", n.ID, nr.staged, nr.stageMS)
	diffing := time.Now()
	for _, s := range w.staged {
		k := slices.IndexFunc(nr.tables, func(tr TableResult) bool { return tr.Table == s.t.Name })
		if err := diffTable(ctx, c, s, pieces, opt.Samples, &nr.tables[k]); err != nil {
			return w, fmt.Errorf("%s: diff: %w", s.t.Name, err)
		}
		tr := nr.tables[k]
		say("node %s: %s: %d back, %d changed, %d gone since the point", n.ID, s.t.Name, tr.Back, tr.Changed, tr.Gone)
	}
	nr.diffMS = ms(time.Since(diffing))
	return w, nil
}

// apply applies what differs in one transaction, the bucket's pause,
// tried 3 times when writers held the range longer than LockTimeout. It
// applies nothing before the pause: restored rows would be seen and
// changed by users, and the pause would then undo their changes. So the
// restore takes effect at the pause's commit, all at once.
func (w *ownerWork) apply(ctx context.Context, opt RestoreOptions, say func(string, ...any)) error {
	if len(w.staged) == 0 {
		return nil
	}
	start := time.Now()
	for attempt := 1; ; attempt++ {
		pause, err := applyTx(ctx, w.c, w.node.ID, w.staged, w.pieces, opt)
		if err == nil {
			w.nr.pauseMS = ms(pause)
			// Writers also waited behind the attempts that gave up.
			w.nr.waitedMS = ms(time.Since(start))
			say("node %s: applied; the bucket's writes paused %.1f ms", w.node.ID, w.nr.pauseMS)
			return nil
		}
		if attempt == 3 || !isLockTimeout(err) {
			return fmt.Errorf("apply: %w", err)
		}
		say("node %s: writers held the bucket longer than %s; trying the pause again", w.node.ID, opt.LockTimeout)
	}
}

// stageTable creates the staging table and copies every piece's rows of t
// from its scratch server into it. skipped says why a table is left out.
// A staging table made is returned even with an error, to be dropped.
func stageTable(ctx context.Context, c *pgx.Conn, t topo.TableRecord, stage string, pieces []Piece, scratch map[string]*Scratch) (*stagedTable, string, error) {
	live, err := columnsOf(ctx, c, t.Name)
	if err != nil {
		return nil, "", err
	}
	if live == nil {
		return nil, "dropped since the point: not restored (restore it with the schema first, or leave it out with --tables)", nil
	}
	pk, err := primaryKey(ctx, c, t.Name)
	if err != nil {
		return nil, "", err
	}
	if len(pk) == 0 {
		return nil, "", fmt.Errorf("it has no primary key: rows cannot be matched")
	}
	var cols []column
	for _, from := range distinctFrom(pieces) {
		sc, err := scratch[from].Connect(ctx)
		if err != nil {
			return nil, "", fmt.Errorf("scratch server of %s: %w", from, err)
		}
		then, err := columnsOf(ctx, sc, t.Name)
		sc.Close(ctx)
		if err != nil {
			return nil, "", err
		}
		if then == nil {
			return nil, "not at the point (created since): nothing to restore", nil
		}
		// The live table's columns the point had, of the same type: a
		// binary copy of another type reads its bytes as this one's
		// (an int4 read as a float4, a timestamp as a timestamptz).
		var common []column
		for _, lc := range live {
			k := slices.IndexFunc(then, func(tc column) bool { return tc.name == lc.name })
			if k < 0 {
				continue
			}
			if then[k].typ != lc.typ {
				return nil, "", hint.New(fmt.Errorf("column %s was %s at the point and is %s now", lc.name, then[k].typ, lc.typ),
					"restore the other tables (--tables), or this one into a copy by hand from a scratch server")
			}
			common = append(common, lc)
		}
		if cols == nil || len(common) < len(cols) {
			cols = common
		}
	}
	names := make([]string, len(cols))
	for i, col := range cols {
		names[i] = col.name
	}
	for _, k := range pk {
		if !slices.Contains(names, k) {
			return nil, "", fmt.Errorf("primary key column %s was not at the point", k)
		}
	}
	colList := quoteList(names)
	if _, err := c.Exec(ctx, fmt.Sprintf(`CREATE UNLOGGED TABLE %s AS SELECT %s FROM %s WITH NO DATA`, stage, colList, qualified(t.Name))); err != nil {
		return nil, "", err
	}
	st := &stagedTable{t: t, stage: stage, cols: names, pk: pk}
	for _, col := range cols {
		if col.identityAlways && !slices.Contains(pk, col.name) {
			st.noSet = append(st.noSet, col.name)
		}
	}
	for _, pc := range pieces {
		sc, err := scratch[pc.From].Connect(ctx)
		if err != nil {
			return st, "", err
		}
		err = copyRange(ctx, sc, c, fmt.Sprintf(`COPY (SELECT %s FROM %s WHERE %s BETWEEN %d AND %d) TO STDOUT (FORMAT binary)`, colList, qualified(t.Name), quoteIdent(t.KeyColumn), pc.Lo, pc.Hi),
			fmt.Sprintf(`COPY %s (%s) FROM STDIN (FORMAT binary)`, stage, colList))
		sc.Close(ctx)
		if err != nil {
			return st, "", err
		}
	}
	if _, err := c.Exec(ctx, fmt.Sprintf(`CREATE INDEX ON %s (%s)`, stage, quoteList(pk))); err != nil {
		return st, "", err
	}
	if _, err := c.Exec(ctx, `ANALYZE `+stage); err != nil {
		return st, "", err
	}
	return st, "", nil
}

func distinctFrom(pieces []Piece) []string {
	var out []string
	for _, pc := range pieces {
		if !slices.Contains(out, pc.From) {
			out = append(out, pc.From)
		}
	}
	return out
}

// The diff's and apply's statements. In each, l is the live table, s the
// staging table; the range predicate limits l to the node's pieces.
func rangeOf(alias, key string, pieces []Piece) string {
	var or []string
	for _, pc := range pieces {
		or = append(or, fmt.Sprintf("%s.%s BETWEEN %d AND %d", alias, quoteIdent(key), pc.Lo, pc.Hi))
	}
	return "(" + strings.Join(or, " OR ") + ")"
}

func pkMatch(pk []string) string {
	var and []string
	for _, k := range pk {
		and = append(and, fmt.Sprintf("l.%s = s.%s", quoteIdent(k), quoteIdent(k)))
	}
	return strings.Join(and, " AND ")
}

// rowOf is the row of cols as text: compared as text, a json column
// (which has no equality), a citext's case and a numeric's scale differ
// as they should.
func rowOf(alias string, cols []string) string {
	var out []string
	for _, c := range cols {
		out = append(out, alias+"."+quoteIdent(c))
	}
	return "ROW(" + strings.Join(out, ", ") + ")::text"
}

type diffSQL struct{ back, changed, gone string }

func diffQueries(st stagedTable, pieces []Piece) diffSQL {
	t, key := qualified(st.t.Name), st.t.KeyColumn
	in := rangeOf("l", key, pieces)
	return diffSQL{
		back:    fmt.Sprintf(`FROM %s s WHERE NOT EXISTS (SELECT 1 FROM %s l WHERE %s AND %s)`, st.stage, t, pkMatch(st.pk), in),
		changed: fmt.Sprintf(`FROM %s s JOIN %s l ON %s AND %s WHERE %s IS DISTINCT FROM %s`, st.stage, t, pkMatch(st.pk), in, rowOf("s", st.cols), rowOf("l", st.cols)),
		gone:    fmt.Sprintf(`FROM %s l WHERE %s AND NOT EXISTS (SELECT 1 FROM %s s WHERE %s)`, t, in, st.stage, pkMatch(st.pk)),
	}
}

func diffTable(ctx context.Context, c *pgx.Conn, st stagedTable, pieces []Piece, samples int, tr *TableResult) error {
	q := diffQueries(st, pieces)
	for _, k := range []struct {
		from string
		n    *int64
		keys *[]string
		of   string
	}{{q.back, &tr.Back, &tr.BackKeys, "s"}, {q.changed, &tr.Changed, &tr.ChangedKeys, "s"}, {q.gone, &tr.Gone, &tr.GoneKeys, "l"}} {
		if err := c.QueryRow(ctx, `SELECT count(*) `+k.from).Scan(k.n); err != nil {
			return err
		}
		rows, err := c.Query(ctx, fmt.Sprintf(`SELECT %s %s ORDER BY 1 LIMIT %d`, rowOf(k.of, st.pk), k.from, samples))
		if err != nil {
			return err
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		*k.keys = keys
	}
	return nil
}

// applyTx applies what differs on one node in one transaction, the
// bucket's write pause: it holds the fence's drain locks of the pieces'
// granules. It returns how long writers were held back. Read committed:
// each statement sees what the writers drained before it committed.
func applyTx(ctx context.Context, c *pgx.Conn, node bucketmap.NodeID, staged []stagedTable, pieces []Piece, opt RestoreOptions) (time.Duration, error) {
	tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, opt.LockTimeout.Milliseconds())); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		return 0, err
	}
	// A flip of this node's fence takes fence_meta FOR UPDATE: none
	// commits while this transaction runs.
	if _, err := tx.Exec(ctx, `SELECT 1 FROM shardvisor.fence_meta FOR SHARE`); err != nil {
		return 0, fmt.Errorf("the node's fence: %w", err)
	}
	// The statements are written before the pause, and sent in one batch
	// inside it: each round trip in the pause is one the bucket's writers
	// wait for.
	var stmts, names []string
	for _, st := range staged {
		t := qualified(st.t.Name)
		in := rangeOf("l", st.t.KeyColumn, pieces)
		if opt.Mode == ModeReplace {
			var set []string
			for _, col := range st.cols {
				if slices.Contains(st.pk, col) || slices.Contains(st.noSet, col) {
					continue // equal by the match, or not settable
				}
				set = append(set, fmt.Sprintf("%s = s.%s", quoteIdent(col), quoteIdent(col)))
			}
			if len(set) > 0 {
				stmts = append(stmts, fmt.Sprintf(`UPDATE %s l SET %s FROM %s s WHERE %s AND %s AND %s IS DISTINCT FROM %s`, t, strings.Join(set, ", "), st.stage, pkMatch(st.pk), in, rowOf("s", st.cols), rowOf("l", st.cols)))
				names = append(names, st.t.Name)
			}
			stmts = append(stmts, fmt.Sprintf(`DELETE FROM %s l WHERE %s AND NOT EXISTS (SELECT 1 FROM %s s WHERE %s)`, t, in, st.stage, pkMatch(st.pk)))
			names = append(names, st.t.Name)
		}
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO %s (%s) OVERRIDING SYSTEM VALUE SELECT %s FROM %s s WHERE NOT EXISTS (SELECT 1 FROM %s l WHERE %s AND %s)`,
			t, quoteList(st.cols), quoteListOf("s", st.cols), st.stage, t, pkMatch(st.pk), in))
		names = append(names, st.t.Name)
	}
	var gs []int32
	for _, pc := range pieces {
		for g := fence.Granule(pc.Lo); g <= fence.Granule(pc.Hi); g++ {
			gs = append(gs, g)
		}
	}
	slices.Sort(gs)
	gs = slices.Compact(gs)
	held := time.Now()
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.pg_advisory_xact_lock($1, g) FROM unnest($2::int4[]) WITH ORDINALITY AS u(g, i) ORDER BY i`, fence.LockClass, gs); err != nil {
		return 0, err
	}
	f, err := fence.Read(ctx, tx)
	if err != nil {
		return 0, err
	}
	for _, pc := range pieces {
		if !covered(f.Spans, pc.Lo, pc.Hi) {
			return 0, hint.New(fmt.Errorf("node %s no longer owns keys %d..%d (the bucket moved during the restore)", node, pc.Lo, pc.Hi), "run the restore again")
		}
	}
	b := &pgx.Batch{}
	for _, q := range stmts {
		b.Queue(q)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("%s: %w", batchTable(names), err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return time.Since(held), nil
}

// batchTable names the tables of a failed batch (pgx does not say which
// statement of a batch failed).
func batchTable(names []string) string {
	return strings.Join(slices.Compact(slices.Clone(names)), ", ")
}

// covered: lo..hi lies in spans owned.
func covered(spans []fence.Span, lo, hi int64) bool {
	next := lo
	for _, s := range spans {
		if s.State != fence.Owned || s.Hi < next || s.Lo > next {
			continue
		}
		if s.Hi >= hi {
			return true
		}
		next = s.Hi + 1
	}
	return false
}

func isLockTimeout(err error) bool {
	return strings.Contains(err.Error(), "SQLSTATE 55P03")
}

// column is a writable column: its name, its type as format_type gives
// it, and whether it is an identity column GENERATED ALWAYS.
type column struct {
	name, typ      string
	identityAlways bool
}

// columnsOf lists a table's columns that can be written (not dropped, not
// generated), in order; nil if the table does not exist.
func columnsOf(ctx context.Context, q fence.Querier, table string) ([]column, error) {
	rows, err := q.Query(ctx, `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attidentity = 'a' FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
		ORDER BY a.attnum`, table)
	if err != nil {
		return nil, err
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (column, error) {
		var c column
		err := r.Scan(&c.name, &c.typ, &c.identityAlways)
		return c, err
	})
	if err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		var exists bool
		if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
			return nil, err
		}
	}
	return cols, nil
}

func primaryKey(ctx context.Context, q fence.Querier, table string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT a.attname::text FROM pg_index i
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		WHERE i.indrelid = to_regclass($1) AND i.indisprimary
		ORDER BY array_position(i.indkey::int2[], a.attnum)`, table)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func qualified(name string) string {
	schema, table, _ := strings.Cut(name, ".")
	return quoteIdent(schema) + "." + quoteIdent(table)
}

func quoteList(cols []string) string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = quoteIdent(c)
	}
	return strings.Join(out, ", ")
}

func quoteListOf(alias string, cols []string) string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = alias + "." + quoteIdent(c)
	}
	return strings.Join(out, ", ")
}
