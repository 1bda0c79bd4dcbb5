package fence

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/sqlstate"
	"github.com/shardvisor/shardvisor/topo"
)

// DB starts transactions: *pgx.Conn, *pgxpool.Pool and pgx.Tx (as a
// savepoint, so that locks are held until the caller's transaction ends)
// all qualify.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Querier runs statements: *pgx.Conn, *pgxpool.Pool and pgx.Tx qualify.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var (
	// ErrNotInstalled means the node has no fence (run `shardctl node
	// prepare`).
	ErrNotInstalled = errors.New("fence is not installed")
	// ErrWrongNode means the database's fence was prepared for another
	// node or cluster: two registry entries probably point at the same
	// database.
	ErrWrongNode = errors.New("fence belongs to another node")
	// ErrStale means the fence has already applied a newer map version
	// than the one offered; nothing was changed.
	ErrStale = errors.New("fence has seen a newer map version")
)

// LockTimeout bounds how long a flip waits for the locks of in-flight
// writers (and how long new writers wait behind it).
var LockTimeout = 5 * time.Second

// IsRejected reports whether err is a write the fence rejected (SQLSTATE
// SV001): the row's bucket is not owned by this node, frozen, incoming, or
// its key is null. Applications re-read the map and retry on the owner.
func IsRejected(err error) bool { return sqlstate.IsFenceRejected(err) }

// IsIsolationRejected reports whether err is a fenced write rejected for
// running above READ COMMITTED (SQLSTATE SV002).
func IsIsolationRejected(err error) bool { return sqlState(err) == SQLStateIsolation }

func sqlState(err error) string { return sqlstate.Of(err) }

// Meta is the fence's bookkeeping row.
type Meta struct {
	FenceVersion int       `json:"fence_version"`
	Cluster      string    `json:"cluster"`
	Node         string    `json:"node"`
	MapVersion   uint64    `json:"map_version"` // highest map version applied
	Level        int       `json:"level"`       // map level at that version
	UpdatedAt    time.Time `json:"updated_at"`
}

// Fence is a node's fence as stored.
type Fence struct {
	Meta
	Spans []Span `json:"spans"`
}

// Installed reports whether the fence's tables exist on the node.
func Installed(ctx context.Context, q Querier) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT to_regclass('shardvisor.fence_meta') IS NOT NULL AND to_regclass('shardvisor.ownership') IS NOT NULL`).Scan(&ok)
	return ok, err
}

// Read returns the node's fence, or ErrNotInstalled.
func Read(ctx context.Context, q Querier) (*Fence, error) {
	if ok, err := Installed(ctx, q); err != nil {
		return nil, err
	} else if !ok {
		return nil, ErrNotInstalled
	}
	f := &Fence{}
	var err error
	if f.Meta, err = readMeta(ctx, q, false); err != nil {
		return nil, err
	}
	f.Spans, err = readSpans(ctx, q)
	return f, err
}

const metaSQL = `SELECT fence_version, cluster, node, map_version, level, updated_at FROM shardvisor.fence_meta`

func readMeta(ctx context.Context, q Querier, forUpdate bool) (Meta, error) {
	sql := metaSQL
	if forUpdate {
		sql += ` FOR UPDATE`
	}
	m, err := scanMeta(q.QueryRow(ctx, sql))
	return m, notInstalled(err)
}

func scanMeta(r pgx.Row) (Meta, error) {
	var m Meta
	var mv int64
	err := r.Scan(&m.FenceVersion, &m.Cluster, &m.Node, &mv, &m.Level, &m.UpdatedAt)
	m.MapVersion = uint64(mv)
	return m, err
}

// notInstalled names the errors of a node without a fence.
func notInstalled(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: shardvisor.fence_meta is empty", ErrNotInstalled)
	}
	if pe := sqlState(err); pe == "42P01" || pe == "3F000" { // undefined table / schema
		return ErrNotInstalled
	}
	return err
}

const spansSQL = `SELECT lo, hi, state, epoch FROM shardvisor.ownership ORDER BY lo`

func readSpans(ctx context.Context, q Querier) ([]Span, error) {
	rows, err := q.Query(ctx, spansSQL)
	if err != nil {
		return nil, err
	}
	return collectSpans(rows)
}

func collectSpans(rows pgx.Rows) ([]Span, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Span, error) {
		var s Span
		var st string
		var ep int64
		err := r.Scan(&s.Lo, &s.Hi, &st, &ep)
		s.State, s.Epoch = State(st), uint64(ep)
		return s, err
	})
}

// Change is what one flip did to a node's fence.
type Change struct {
	FromVersion uint64 `json:"from_map_version"`
	ToVersion   uint64 `json:"to_map_version"`
	Removed     []Span `json:"removed,omitempty"` // rows deleted
	Added       []Span `json:"added,omitempty"`   // rows inserted
	// Drained is the number of lock granules taken exclusively because a
	// range stopped being owned: the flip waited for their writers.
	Drained int `json:"drained_granules"`
}

// Changed reports whether any ownership row changed.
func (c Change) Changed() bool { return len(c.Removed)+len(c.Added) > 0 }

// Sync brings the fence of node in step with map m, in one transaction
// (see Wanted): the node's buckets become owned, those of a moving bucket
// too unless its mover has frozen it already, the buckets it is a move's
// target for become incoming, and nothing else is owned. Incoming ranges
// the map does not contradict are kept (a mover marks its target incoming
// while copying, before the map says anything). Every range that stops
// being owned is drained first: the flip takes its lock granules
// exclusively, waiting for writers in flight.
//
// Sync never goes back in time: if the fence has applied a newer map
// version, it changes nothing and returns ErrStale. Applying the same
// version again repairs drift.
func Sync(ctx context.Context, db DB, m *bucketmap.Map, node bucketmap.NodeID) (Change, error) {
	return flip(ctx, db, m.Version, m.Level, string(node), true, func(cur []Span) []Span {
		return Wanted(cur, m, node)
	}, nil)
}

// SetState sets the key range lo..hi (inclusive; use keystream.Range for a
// bucket) to state st, or removes it from the fence when st is Absent, in
// one transaction that first takes the range's lock granules exclusively
// and so waits for every writer in flight there. epoch is the map version
// the change belongs to; it must not be older than the newest version the
// fence has applied (ErrStale), and becomes the fence's version if newer.
// Writers arriving meanwhile wait for the flip and then see the new state.
//
// db may be a pgx.Tx: the flip then runs in a savepoint and the exclusive
// locks are held until the caller's transaction ends.
func SetState(ctx context.Context, db DB, lo, hi int64, st State, epoch uint64) (Change, error) {
	if lo > hi {
		return Change{}, fmt.Errorf("fence: range %d..%d: lo > hi", lo, hi)
	}
	if st != Absent && !st.valid() {
		return Change{}, fmt.Errorf("fence: state %q is not owned, frozen, incoming or absent", st)
	}
	return setState(ctx, db, lo, hi, st, epoch, nil)
}

func setState(ctx context.Context, db DB, lo, hi int64, st State, epoch uint64, also []Stmt) (Change, error) {
	return flip(ctx, db, epoch, -1, "", false, func(cur []Span) []Span {
		return setSpans(cur, lo, hi, st, epoch)
	}, also, lo, hi)
}

// setSpans cuts lo..hi out of cur, then lays the new span over it.
func setSpans(cur []Span, lo, hi int64, st State, epoch uint64) []Span {
	var top []Span
	if st != Absent {
		top = []Span{{Lo: lo, Hi: hi, State: st, Epoch: epoch}}
	}
	var rest []Span
	for _, g := range sweep(cur, []Span{{Lo: lo, Hi: hi, State: Owned}}) {
		if g.A >= 0 && g.B < 0 {
			s := cur[g.A]
			rest = appendMerged(rest, Span{Lo: g.Lo, Hi: g.Hi, State: s.State, Epoch: s.Epoch})
		}
	}
	return overlay(rest, top)
}

// Freeze starts a move's write pause on this node (the source): writes to
// lo..hi are rejected from now on, and Freeze returns only when every write
// to it that was in flight has committed or rolled back.
func Freeze(ctx context.Context, db DB, lo, hi int64, epoch uint64) (Change, error) {
	return FreezeWith(ctx, db, lo, hi, epoch)
}

// FreezeWith is Freeze running also in the freeze's own transaction, after
// the drain: a move writes its barrier marker there, so that the marker
// follows, in commit order, every write the freeze waited for.
func FreezeWith(ctx context.Context, db DB, lo, hi int64, epoch uint64, also ...Stmt) (Change, error) {
	if lo > hi {
		return Change{}, fmt.Errorf("fence: range %d..%d: lo > hi", lo, hi)
	}
	return setState(ctx, db, lo, hi, Frozen, epoch, also)
}

// SetIncoming marks lo..hi on a move's target while its rows are copied in:
// application writes are rejected, replication apply is not.
func SetIncoming(ctx context.Context, db DB, lo, hi int64, epoch uint64) (Change, error) {
	return SetState(ctx, db, lo, hi, Incoming, epoch)
}

// Own lets this node accept writes to lo..hi (a move's target at the end
// of the pause, or an aborted move's source).
func Own(ctx context.Context, db DB, lo, hi int64, epoch uint64) (Change, error) {
	return SetState(ctx, db, lo, hi, Owned, epoch)
}

// Release removes lo..hi from the fence: this node no longer owns it.
func Release(ctx context.Context, db DB, lo, hi int64, epoch uint64) (Change, error) {
	return SetState(ctx, db, lo, hi, Absent, epoch)
}

// Pending is a fence change made but not committed: its transaction is
// open and holds the fence's meta row and the range's lock granules.
// Writers to the range wait for it; nothing is visible until Commit.
type Pending struct {
	Change Change
	tx     pgx.Tx
}

// PrepareOwn is Own up to, not including, the commit. A move prepares its
// target's ownership before the write pause and commits it right after the
// map names the target, in one round trip, so that the target never owns
// the range before the map says so (a writer holding an old route to it
// would otherwise be accepted, and lost if the move then aborted) and yet
// the pause does not wait for a whole fence change. version is the map
// version expected to make it official (the flip's): recording it refuses
// a later sync with an older map as stale.
func PrepareOwn(ctx context.Context, db DB, lo, hi int64, version uint64) (*Pending, error) {
	if lo > hi {
		return nil, fmt.Errorf("fence: range %d..%d: lo > hi", lo, hi)
	}
	ch, tx, err := flipTx(ctx, db, version, -1, "", false, func(cur []Span) []Span {
		return setSpans(cur, lo, hi, Owned, version)
	}, nil, lo, hi)
	if err != nil {
		return nil, err
	}
	return &Pending{Change: ch, tx: tx}, nil
}

// Commit commits the change: one round trip.
func (p *Pending) Commit(ctx context.Context) error {
	if err := p.tx.Commit(ctx); err != nil {
		return fmt.Errorf("fence: committing: %w", err)
	}
	return nil
}

// Rollback abandons the change.
func (p *Pending) Rollback(ctx context.Context) {
	_ = p.tx.Rollback(context.WithoutCancel(ctx))
}

// Stmt is an extra statement a fence change runs in its own transaction
// (see FreezeWith).
type Stmt struct {
	SQL  string
	Args []any
}

// flip runs one fence change: lock the meta row, check the version, compute
// the new spans from the current ones, drain what stops being owned, write
// the difference. sync (a whole-map apply) refuses strictly older versions
// and checks the node; a primitive refuses older epochs. drainAll ranges
// are drained whatever their state (the primitives' target range).
//
// A move's write pause is made of flips, so a flip is pipelined: on a
// connection of its own (*pgx.Conn), two round trips (begin, read; drain,
// write, commit) whatever the change, instead of one per statement; in a
// transaction (pgx.Tx, or any other DB) four (begin; read; drain and
// write; commit).
func flip(ctx context.Context, db DB, version uint64, level int, node string, sync bool, next func(cur []Span) []Span, also []Stmt, drainAll ...int64) (Change, error) {
	if c, ok := db.(*pgx.Conn); ok && c.PgConn().TxStatus() == 'I' {
		return flipPipelined(ctx, c, version, level, node, sync, next, also, drainAll...)
	}
	ch, tx, err := flipTx(ctx, db, version, level, node, sync, next, also, drainAll...)
	if err != nil {
		return ch, err
	}
	return ch, tx.Commit(ctx)
}

// flipPipelined is flip on an idle connection, with BEGIN sent with the
// reads and COMMIT with the writes. A failure leaves no transaction open:
// whatever the server did not run (a statement after the failing one,
// COMMIT included) is rolled back.
func flipPipelined(ctx context.Context, c *pgx.Conn, version uint64, level int, node string, sync bool, next func(cur []Span) []Span, also []Stmt, drainAll ...int64) (_ Change, err error) {
	defer func() {
		if err != nil && c.PgConn().TxStatus() != 'I' && !c.IsClosed() {
			_, _ = c.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	return flipOn(ctx, c, true, version, level, node, sync, next, also, drainAll...)
}

// flipTx is flip without the commit: on success the caller owns the open
// transaction (see Pending); on error it is rolled back.
func flipTx(ctx context.Context, db DB, version uint64, level int, node string, sync bool, next func(cur []Span) []Span, also []Stmt, drainAll ...int64) (_ Change, _ pgx.Tx, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return Change{}, nil, err
	}
	ch, err := flipOn(ctx, tx, false, version, level, node, sync, next, also, drainAll...)
	if err != nil {
		tx.Rollback(context.WithoutCancel(ctx))
		return ch, nil, err
	}
	return ch, tx, nil
}

// batchSender sends a pipeline of statements: pgx.Tx and *pgx.Conn.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// flipOn reads, computes and writes one fence change on s; own says s is
// an idle connection on which the change begins and commits its own
// transaction (flipPipelined), else s is in a transaction the caller
// commits.
func flipOn(ctx context.Context, s batchSender, own bool, version uint64, level int, node string, sync bool, next func(cur []Span) []Span, also []Stmt, drainAll ...int64) (_ Change, err error) {
	var meta Meta
	var cur []Span
	read := &pgx.Batch{}
	if own {
		read.Queue(`BEGIN`)
	}
	read.Queue(fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, LockTimeout.Milliseconds()))
	read.Queue(metaSQL + ` FOR UPDATE`).QueryRow(func(r pgx.Row) error {
		meta, err = scanMeta(r)
		return err
	})
	read.Queue(spansSQL).Query(func(rows pgx.Rows) error {
		cur, err = collectSpans(rows)
		return err
	})
	if err := s.SendBatch(ctx, read).Close(); err != nil {
		return Change{}, notInstalled(err)
	}
	ch := Change{FromVersion: meta.MapVersion, ToVersion: max(meta.MapVersion, version)}
	if sync && meta.Node != node {
		return ch, fmt.Errorf("%w: this database was prepared as node %s of cluster %s, not node %s", ErrWrongNode, meta.Node, meta.Cluster, node)
	}
	if version < meta.MapVersion {
		return ch, fmt.Errorf("%w: the fence is at map version %d, the change is for version %d", ErrStale, meta.MapVersion, version)
	}
	want, err := Normalize(next(cur))
	if err != nil {
		return ch, fmt.Errorf("fence: %w", err)
	}
	write := &pgx.Batch{}
	// Drain: granules of every range that was owned and is no longer.
	var drain []int32
	for _, d := range Compare(want, cur) {
		if d.Got == Owned {
			drain = append(drain, granules(d.Lo, d.Hi)...)
		}
	}
	if len(drainAll) == 2 {
		drain = append(drain, granules(drainAll[0], drainAll[1])...)
	}
	slices.Sort(drain)
	drain = slices.Compact(drain)
	if len(drain) > 0 {
		write.Queue(`SELECT pg_catalog.pg_advisory_xact_lock($1, g) FROM unnest($2::int4[]) WITH ORDINALITY AS u(g, i) ORDER BY i`, LockClass, drain)
	}
	ch.Drained = len(drain)
	// Rewrite only the rows that differ (by range and state).
	type key struct {
		lo, hi int64
		st     State
	}
	have := map[key]bool{}
	for _, s := range cur {
		have[key{s.Lo, s.Hi, s.State}] = true
	}
	keep := map[key]bool{}
	for _, s := range want {
		k := key{s.Lo, s.Hi, s.State}
		if have[k] {
			keep[k] = true
		} else {
			if s.Epoch == 0 || s.Epoch < version {
				s.Epoch = version
			}
			ch.Added = append(ch.Added, s)
		}
	}
	var del []int64
	for _, s := range cur {
		if !keep[key{s.Lo, s.Hi, s.State}] {
			ch.Removed = append(ch.Removed, s)
			del = append(del, s.Lo)
		}
	}
	if len(del) > 0 {
		write.Queue(`DELETE FROM shardvisor.ownership WHERE lo = ANY($1)`, del)
	}
	if len(ch.Added) > 0 {
		los, his, sts, eps := make([]int64, 0, len(ch.Added)), make([]int64, 0, len(ch.Added)), make([]string, 0, len(ch.Added)), make([]int64, 0, len(ch.Added))
		for _, s := range ch.Added {
			los, his, sts, eps = append(los, s.Lo), append(his, s.Hi), append(sts, string(s.State)), append(eps, int64(s.Epoch))
		}
		write.Queue(`INSERT INTO shardvisor.ownership (lo, hi, state, epoch) SELECT * FROM unnest($1::int8[], $2::int8[], $3::text[], $4::int8[])`, los, his, sts, eps)
	}
	if level < 0 {
		level = meta.Level
	}
	write.Queue(`UPDATE shardvisor.fence_meta SET map_version = $1, level = $2, updated_at = now()`, int64(ch.ToVersion), level)
	for _, st := range also {
		write.Queue(st.SQL, st.Args...)
	}
	if own {
		write.Queue(`COMMIT`)
	}
	if err := s.SendBatch(ctx, write).Close(); err != nil {
		if sqlState(err) == "55P03" { // lock_not_available: lock_timeout
			return ch, fmt.Errorf("fence: draining writers of %d lock granules: %w", len(drain), err)
		}
		return ch, err
	}
	return ch, nil
}

// InstallResult says what Install did.
type InstallResult struct {
	// Actions are the changes made, for people ("created trigger on
	// app.events"); empty when the node was already prepared.
	Actions []string `json:"actions"`
	// Problems are tables that could not be fenced (missing table or key
	// column); the rest was installed.
	Problems []string `json:"problems,omitempty"`
}

// Install prepares a node, idempotently and in one transaction: the
// shardvisor schema with the ownership and meta tables, the error
// functions, and on every sharded table the fence trigger with its
// function; fence triggers on tables that are no longer sharded are
// dropped. It refuses a database prepared for another node or cluster
// (ErrWrongNode). It does not fill the ownership table: Sync does.
func Install(ctx context.Context, db DB, cluster string, node bucketmap.NodeID, tables []topo.TableRecord) (InstallResult, error) {
	var res InstallResult
	if err := topo.ValidateTables(tables); err != nil {
		return res, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return res, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, LockTimeout.Milliseconds())); err != nil {
		return res, err
	}
	installed, err := Installed(ctx, tx)
	if err != nil {
		return res, err
	}
	if installed {
		meta, err := readMeta(ctx, tx, true)
		if err == nil && (meta.Node != string(node) || meta.Cluster != cluster) {
			return res, fmt.Errorf("%w: this database was prepared as node %s of cluster %s, not node %s of cluster %s", ErrWrongNode, meta.Node, meta.Cluster, node, cluster)
		}
	}
	var hadSchema bool
	if err := tx.QueryRow(ctx, `SELECT to_regnamespace('shardvisor') IS NOT NULL`).Scan(&hadSchema); err != nil {
		return res, err
	}
	var privs []fencePrivilege
	if hadSchema {
		if privs, err = fencePrivileges(ctx, tx); err != nil {
			return res, err
		}
	}
	for _, s := range schemaSQL {
		if _, err := tx.Exec(ctx, s); err != nil {
			return res, fmt.Errorf("fence install: %w", err)
		}
	}
	// schemaSQL revokes what PUBLIC must not have; grants to named roles
	// stay (an admin made them) and check reports them.
	if len(privs) > 0 {
		left, err := fencePrivileges(ctx, tx)
		if err != nil {
			return res, err
		}
		for _, p := range privs {
			if !slices.Contains(left, p) {
				res.Actions = append(res.Actions, fmt.Sprintf("revoked %s on %s from %s", p.privs, p.object, p.grantee))
			}
		}
	}
	if !hadSchema {
		res.Actions = append(res.Actions, "created schema shardvisor")
	}
	if !installed {
		res.Actions = append(res.Actions, "created tables shardvisor.ownership and shardvisor.fence_meta")
	}
	for _, f := range sharedFunctions {
		installed, err := installFunction(ctx, tx, f)
		if err != nil {
			return res, err
		}
		if installed {
			res.Actions = append(res.Actions, "installed function shardvisor."+f.name)
		}
	}
	tag, err := tx.Exec(ctx, `INSERT INTO shardvisor.fence_meta (fence_version, cluster, node) VALUES ($1, $2, $3) ON CONFLICT (singleton) DO UPDATE SET fence_version = EXCLUDED.fence_version WHERE fence_meta.fence_version <> EXCLUDED.fence_version`, Version, cluster, string(node))
	if err != nil {
		return res, err
	}
	if tag.RowsAffected() > 0 {
		res.Actions = append(res.Actions, fmt.Sprintf("recorded node %s of cluster %s, fence version %d", node, cluster, Version))
	}
	wantFns := map[string]bool{}
	wantTables := map[string]bool{}
	for _, t := range tables {
		wantFns[funcName(t)] = true
		wantTables[t.Name] = true
		probs, acts, err := installTable(ctx, tx, t)
		if err != nil {
			return res, err
		}
		res.Problems = append(res.Problems, probs...)
		res.Actions = append(res.Actions, acts...)
	}
	// Fence triggers on tables that are no longer sharded, and functions
	// no trigger uses any more.
	stale, err := fencedTables(ctx, tx)
	if err != nil {
		return res, err
	}
	for _, s := range stale {
		if wantTables[s[0]+"."+s[1]] {
			continue
		}
		tbl := quoteIdent(s[0]) + "." + quoteIdent(s[1])
		for _, name := range triggerNames {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`DROP TRIGGER IF EXISTS %s ON %s`, quoteIdent(name), tbl)); err != nil {
				return res, err
			}
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s DROP CONSTRAINT IF EXISTS %s`, tbl, quoteIdent(ConstraintName))); err != nil {
			return res, err
		}
		res.Actions = append(res.Actions, fmt.Sprintf("dropped the fence trigger of %s.%s, with its constraint and TRUNCATE guard (no longer a sharded table)", s[0], s[1]))
	}
	rows, err := tx.Query(ctx, `SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'shardvisor'::regnamespace AND p.proname LIKE 'fence\_%' ORDER BY 1`)
	if err != nil {
		return res, err
	}
	fns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return res, err
	}
	for _, fn := range fns {
		if !wantFns[fn] {
			if _, err := tx.Exec(ctx, `DROP FUNCTION shardvisor.`+quoteIdent(fn)+`()`); err != nil {
				return res, err
			}
			res.Actions = append(res.Actions, "dropped unused function shardvisor."+fn)
		}
	}
	return res, tx.Commit(ctx)
}

// functionState says whether f exists and whether it is exactly this
// version's: body, volatility, SECURITY INVOKER, the pinned search_path
// and (for trigger functions) the comment. A function of an older version
// differs in at least one, so prepare replaces it.
func functionState(ctx context.Context, q Querier, f function) (exists, same bool, err error) {
	var src, vol string
	var cfg []string
	var secdef bool
	var comment *string
	err = q.QueryRow(ctx, `SELECT p.prosrc, p.provolatile::text, COALESCE(p.proconfig, '{}'), p.prosecdef, obj_description(p.oid, 'pg_proc')
		FROM pg_proc p WHERE p.oid = to_regprocedure($1)`, f.signature()).Scan(&src, &vol, &cfg, &secdef, &comment)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	wantVol := "v"
	if f.stable {
		wantVol = "s"
	}
	same = src == f.body && vol == wantVol && !secdef && slices.Equal(cfg, []string{"search_path=" + searchPath}) &&
		(f.comment == "" || comment != nil && *comment == f.comment)
	return true, same, nil
}

// installFunction creates or replaces f unless it is already this
// version's, and reports whether it did.
func installFunction(ctx context.Context, tx pgx.Tx, f function) (bool, error) {
	_, same, err := functionState(ctx, tx, f)
	if err != nil || same {
		return false, err
	}
	if _, err := tx.Exec(ctx, f.createSQL()); err != nil {
		return false, fmt.Errorf("fence install: function shardvisor.%s: %w", f.name, err)
	}
	if f.comment != "" {
		if _, err := tx.Exec(ctx, `COMMENT ON FUNCTION `+f.signature()+` IS `+quoteLiteral(f.comment)); err != nil {
			return false, err
		}
	}
	return true, nil
}

// triggerOK is the condition on pg_trigger (alias t) under which a trigger
// is exactly one of the fence's: $1 table, $2 name, $3 function, $4 type,
// $5 whether it has a WHEN condition; enabled for ordinary sessions only.
const triggerOK = `t.tgrelid = $1 AND t.tgname = $2 AND t.tgfoid = to_regprocedure($3) AND t.tgenabled = 'O' AND t.tgtype = $4
	AND t.tgnargs = 0 AND NOT t.tgisinternal AND (t.tgqual IS NOT NULL) = $5`

func installTable(ctx context.Context, tx pgx.Tx, t topo.TableRecord) (problems, actions []string, err error) {
	var rel *uint32
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1)::oid`, qualified(t)).Scan(&rel); err != nil {
		return nil, nil, err
	}
	if rel == nil {
		return []string{fmt.Sprintf("table %s does not exist on this node; create it, then run prepare again", t.Name)}, nil, nil
	}
	var typ *string
	var attnum int16
	err = tx.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod), attnum FROM pg_attribute WHERE attrelid = $1 AND attname = $2 AND attnum > 0 AND NOT attisdropped`, *rel, t.KeyColumn).Scan(&typ, &attnum)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, err
	}
	if typ == nil {
		return []string{fmt.Sprintf("table %s has no column %s; it was not fenced", t.Name, t.KeyColumn)}, nil, nil
	}
	if *typ != "bigint" {
		problems = append(problems, fmt.Sprintf("%s.%s is %s, not bigint; fenced anyway, but fix the type", t.Name, t.KeyColumn, *typ))
	}
	installed, err := installFunction(ctx, tx, tableFunction(t))
	if err != nil {
		return nil, nil, fmt.Errorf("fence install: trigger function for %s: %w", t.Name, err)
	}
	if installed {
		actions = append(actions, fmt.Sprintf("installed trigger function shardvisor.%s for %s", funcName(t), t.Name))
	}
	for _, tr := range tableTriggers(t) {
		var ok bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger t WHERE `+triggerOK+`)`, *rel, tr.name, tr.fn, tr.tgtype, tr.when).Scan(&ok); err != nil {
			return nil, nil, err
		}
		if ok {
			continue
		}
		if _, err := tx.Exec(ctx, tr.create); err != nil {
			return nil, nil, fmt.Errorf("fence install: trigger %s on %s: %w", tr.name, t.Name, err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ENABLE TRIGGER %s`, qualified(t), quoteIdent(tr.name))); err != nil {
			return nil, nil, err
		}
		if tr.name == TriggerName {
			actions = append(actions, fmt.Sprintf("installed the fence trigger on %s", t.Name))
		} else {
			actions = append(actions, fmt.Sprintf("installed the fence trigger %s on %s", tr.name, t.Name))
		}
	}
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_constraint c WHERE `+constraintCurrent+`)`, *rel, ConstraintName, attnum).Scan(&ok); err != nil {
		return nil, nil, err
	}
	if !ok {
		// Replace whatever has the name: an edited constraint, or one for
		// another key column.
		for _, sql := range []string{
			fmt.Sprintf(`ALTER TABLE %s DROP CONSTRAINT IF EXISTS %s`, qualified(t), quoteIdent(ConstraintName)),
			constraintSQL(t),
		} {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return nil, nil, fmt.Errorf("fence install: constraint on %s: %w", t.Name, err)
			}
		}
		actions = append(actions, fmt.Sprintf("added the fence constraint %s to %s", ConstraintName, t.Name))
	}
	return problems, actions, nil
}
