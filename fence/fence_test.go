package fence

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

var events = topo.TableRecord{Name: "app.events", KeyColumn: "bkey"}

const eventsDDL = `CREATE SCHEMA IF NOT EXISTS app;
CREATE TABLE app.events (bkey bigint NOT NULL, id bigint NOT NULL, body text, PRIMARY KEY (bkey, id))`

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func exec(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// prepared returns a connection to a fresh database with app.events
// fenced for node "a" of m.
func prepared(t *testing.T, node *testenv.PGNode, m *bucketmap.Map, id bucketmap.NodeID) *pgx.Conn {
	t.Helper()
	c := node.Conn(t)
	exec(t, c, eventsDDL)
	if _, err := Install(ctxT(t), c, "c1", id, []topo.TableRecord{events}); err != nil {
		t.Fatal(err)
	}
	if _, err := Sync(ctxT(t), c, m, id); err != nil {
		t.Fatal(err)
	}
	return c
}

// keyIn is a key inside bucket b at level.
func keyIn(level int, b uint32) int64 {
	lo, hi, _ := keystream.Range(level, b)
	return lo + (hi-lo)/2
}

func insert(c *pgx.Conn, k int64, id int) error {
	_, err := c.Exec(context.Background(), `INSERT INTO app.events VALUES ($1, $2, 'x')`, k, id)
	return err
}

func wantRejected(t *testing.T, err error, has ...string) {
	t.Helper()
	if !IsRejected(err) {
		t.Fatalf("want SQLSTATE %s, got %v", SQLState, err)
	}
	for _, h := range has {
		if !strings.Contains(err.Error(), h) {
			t.Fatalf("error %q does not mention %q", err, h)
		}
	}
}

func TestIntegrationFenceRejectsUnownedAndAcceptsOwned(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPGNodes(t, 1)
	m := testMap(t, 4, "a", "b") // a owns 0..7, b owns 8..15
	c := prepared(t, pg.Nodes[0], m, "a")

	if err := insert(c, keyIn(4, 3), 1); err != nil {
		t.Fatalf("owned insert: %v", err)
	}
	err := insert(c, keyIn(4, 12), 1)
	wantRejected(t, err, "INSERT or UPDATE on app.events", "does not own bucket 12 at level 4", "map version 1")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "SV001" || !strings.Contains(pe.Detail, "node a") {
		t.Fatalf("error fields: %+v", pe)
	}
	// A null key: the column's NOT NULL (the contract asks for it) speaks
	// first; the fence rejects one where the column allows it.
	_, err = c.Exec(context.Background(), `INSERT INTO app.events VALUES (NULL, 1, 'x')`)
	if sqlState(err) != "23502" {
		t.Fatalf("null key: %v", err)
	}
	var ok bool
	wantRejected(t, c.QueryRow(context.Background(), `SELECT shardvisor.check_row(NULL, 'app.events'::regclass)`).Scan(&ok), "INSERT or UPDATE on app.events", "null")
	// Boundaries of the owned range: the last key of bucket 7 is owned,
	// the first of bucket 8 is not.
	_, hi7, _ := keystream.Range(4, 7)
	if err := insert(c, hi7, 1); err != nil {
		t.Fatal(err)
	}
	wantRejected(t, insert(c, hi7+1, 1), "bucket 8")

	// Updates: in place is fine; moving a row's key needs both keys owned.
	exec(t, c, `UPDATE app.events SET body = 'y' WHERE bkey = $1`, keyIn(4, 3))
	exec(t, c, `UPDATE app.events SET bkey = $1 WHERE bkey = $2`, keyIn(4, 4), keyIn(4, 3))
	_, err = c.Exec(context.Background(), `UPDATE app.events SET bkey = $1 WHERE bkey = $2`, keyIn(4, 9), keyIn(4, 4))
	wantRejected(t, err, "UPDATE", "bucket 9")

	// Rows in an unowned range (put there by replication apply) can be
	// neither changed nor deleted by applications.
	exec(t, c, `SET session_replication_role = replica`)
	if err := insert(c, keyIn(4, 13), 7); err != nil {
		t.Fatalf("replica-role insert into an unowned range: %v", err)
	}
	exec(t, c, `RESET session_replication_role`)
	_, err = c.Exec(context.Background(), `DELETE FROM app.events WHERE bkey = $1`, keyIn(4, 13))
	wantRejected(t, err, "DELETE", "bucket 13")
	_, err = c.Exec(context.Background(), `UPDATE app.events SET bkey = $1 WHERE bkey = $2`, keyIn(4, 2), keyIn(4, 13))
	wantRejected(t, err, "UPDATE", "bucket 13")
	_, err = c.Exec(context.Background(), `UPDATE app.events SET body = 'z' WHERE bkey = $1`, keyIn(4, 13))
	wantRejected(t, err, "UPDATE", "bucket 13")
	// COPY goes through the row trigger too.
	_, err = c.CopyFrom(context.Background(), pgx.Identifier{"app", "events"}, []string{"bkey", "id"}, pgx.CopyFromRows([][]any{{keyIn(4, 1), int64(50)}, {keyIn(4, 14), int64(51)}}))
	wantRejected(t, err, "bucket 14")

	// Above READ COMMITTED a fenced write is refused outright.
	for _, iso := range []string{"REPEATABLE READ", "SERIALIZABLE"} {
		tx, err := c.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		exec(t, c, "SET TRANSACTION ISOLATION LEVEL "+iso)
		err = insert(c, keyIn(4, 2), 99)
		tx.Rollback(context.Background())
		if !IsIsolationRejected(err) || !strings.Contains(err.Error(), "READ COMMITTED") {
			t.Fatalf("%s: %v", iso, err)
		}
	}
	var n int
	c.QueryRow(context.Background(), `SELECT count(*) FROM app.events`).Scan(&n)
	if n != 3 {
		t.Fatalf("%d rows, want 3", n)
	}
}

func TestIntegrationFenceFollowsSplitAndAssign(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPGNodes(t, 2)
	ctx := ctxT(t)
	m := testMap(t, 3, "a", "b")
	ca := prepared(t, pg.Nodes[0], m, "a")
	cb := prepared(t, pg.Nodes[1], m, "b")

	// Split: the same keys stay owned, the fence records the new level.
	s := m.Clone()
	s.Version++
	if err := s.Split(); err != nil {
		t.Fatal(err)
	}
	ch, err := Sync(ctx, ca, s, "a")
	if err != nil || ch.Changed() || ch.ToVersion != 2 {
		t.Fatalf("sync after split: %+v %v", ch, err)
	}
	if err := insert(ca, keyIn(4, 7), 1); err != nil {
		t.Fatal(err)
	}
	wantRejected(t, insert(ca, keyIn(4, 8), 1), "bucket 8 at level 4", "map version 2")

	// Assign bucket 5 (level 4) from a to b: a rejects it, b accepts it.
	as := s.Clone()
	as.Version++
	if err := as.Assign(bucketmap.Bucket{Prefix: 5, Depth: as.Level}, "b", bucketmap.AssignOptions{NoCopy: true}); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		c  *pgx.Conn
		id bucketmap.NodeID
	}{{ca, "a"}, {cb, "b"}} {
		ch, err := Sync(ctx, x.c, as, x.id)
		if err != nil || !ch.Changed() {
			t.Fatalf("sync %s: %+v %v", x.id, ch, err)
		}
		if x.id == "a" && ch.Drained == 0 {
			t.Fatalf("a lost bucket 5 without draining: %+v", ch)
		}
	}
	wantRejected(t, insert(ca, keyIn(4, 5), 2), "bucket 5 at level 4", "map version 3")
	if err := insert(cb, keyIn(4, 5), 2); err != nil {
		t.Fatal(err)
	}
	f, _ := Read(ctx, ca)
	if len(f.Spans) != 2 || f.MapVersion != 3 || f.Level != 4 {
		t.Fatalf("a's fence: %+v", f)
	}
	// Idempotent; an older map is refused; the wrong node is refused.
	if ch, err := Sync(ctx, ca, as, "a"); err != nil || ch.Changed() {
		t.Fatalf("second sync: %+v %v", ch, err)
	}
	if _, err := Sync(ctx, ca, s, "a"); !errors.Is(err, ErrStale) {
		t.Fatalf("stale map: %v", err)
	}
	if _, err := Sync(ctx, ca, as, "b"); !errors.Is(err, ErrWrongNode) {
		t.Fatalf("wrong node: %v", err)
	}
	if _, err := Install(ctx, ca, "c1", "b", []topo.TableRecord{events}); !errors.Is(err, ErrWrongNode) {
		t.Fatalf("install as another node: %v", err)
	}
	// Drift is repaired by syncing the same version again.
	exec(t, ca, `DELETE FROM shardvisor.ownership`)
	wantRejected(t, insert(ca, keyIn(4, 1), 3))
	if ch, err := Sync(ctx, ca, as, "a"); err != nil || len(ch.Added) != 2 {
		t.Fatalf("repair: %+v %v", ch, err)
	}
	if err := insert(ca, keyIn(4, 1), 3); err != nil {
		t.Fatal(err)
	}
}

// waitLockWaiters waits until n sessions wait for one of the fence's
// advisory locks.
func waitLockWaiters(t *testing.T, c *pgx.Conn, n int) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, func() bool {
		var got int
		err := c.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = $1::oid AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, fmt.Sprint(uint32(LockClass))).Scan(&got)
		return err == nil && got >= n
	}, fmt.Sprintf("%d session(s) waiting for a fence lock", n))
}

// waitBlocked waits until a session waits for a fence lock and checks
// that the operation whose result done carries is still blocked.
func waitBlocked(t *testing.T, watcher *pgx.Conn, done <-chan error, what string) {
	t.Helper()
	waitLockWaiters(t, watcher, 1)
	select {
	case err := <-done:
		t.Fatalf("%s: %v", what, err)
	default:
	}
}

// soleOwner is one node, "a", owning every bucket of a level-4 map, with
// three connections to it: writer (app.events fenced), changer (for the
// fence changes under test) and watcher (for its locks); lo..hi are the
// keys of bucket 6.
func soleOwner(t *testing.T) (ctx context.Context, writer, changer, watcher *pgx.Conn, lo, hi int64) {
	t.Helper()
	pg := testenv.StartPGNodes(t, 1)
	ctx = ctxT(t)
	writer = prepared(t, pg.Nodes[0], testMap(t, 4, "a"), "a")
	changer = pg.Nodes[0].Conn(t)
	watcher = pg.Nodes[0].Conn(t)
	lo, hi, _ = keystream.Range(4, 6)
	return ctx, writer, changer, watcher, lo, hi
}

func TestIntegrationFlipDrainsWriters(t *testing.T) {
	t.Parallel()
	ctx, writer, flipper, watcher, lo, hi := soleOwner(t)

	// A writer in flight holds its granule: Freeze waits for it to commit.
	tx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := insert(writer, keyIn(4, 6), 1); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := Freeze(ctx, flipper, lo, hi, 2); done <- err }()
	waitBlocked(t, watcher, done, "Freeze returned while a writer was in flight")
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the in-flight write must commit: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wantRejected(t, insert(writer, keyIn(4, 6), 2), "bucket 6 at level 4 is frozen", "since map version 2")
	if err := insert(writer, keyIn(4, 7), 2); err != nil {
		t.Fatalf("a neighbouring bucket stays writable: %v", err)
	}

	// A flip in progress holds the granule: a new writer waits for it and
	// then sees its result.
	ftx, err := flipper.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := SetIncoming(ctx, ftx, lo, hi, 3); err != nil {
		t.Fatal(err)
	}
	go func() { done <- insert(writer, keyIn(4, 6), 3) }()
	waitLockWaiters(t, watcher, 1)
	if err := ftx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantRejected(t, <-done, "still being moved to this node", "incoming since map version 3")

	if _, err := Own(ctx, flipper, lo, hi, 4); err != nil {
		t.Fatal(err)
	}
	if err := insert(writer, keyIn(4, 6), 4); err != nil {
		t.Fatal(err)
	}
	if _, err := Release(ctx, flipper, lo, hi, 4); err != nil {
		t.Fatal(err)
	}
	wantRejected(t, insert(writer, keyIn(4, 6), 5), "does not own bucket 6")
	if _, err := Own(ctx, flipper, lo, hi, 3); !errors.Is(err, ErrStale) {
		t.Fatalf("an older epoch: %v", err)
	}
	f, _ := Read(ctx, flipper)
	if len(f.Spans) != 2 || f.MapVersion != 4 {
		t.Fatalf("fence after the flips: %+v", f)
	}
	// A whole-map sync keeps incoming ranges the map does not contradict
	// (a mover marks its target incoming before the map says anything).
	lo12, hi12, _ := keystream.Range(4, 12)
	if _, err := SetIncoming(ctx, flipper, lo12, hi12, 4); err != nil {
		t.Fatal(err)
	}
	two := testMap(t, 4, "a", "z") // a owns 0..7, z owns 8..15
	two.Version = 4
	ch, err := Sync(ctx, flipper, two, "a")
	if err != nil || len(ch.Removed) != 3 || len(ch.Added) != 1 || ch.Drained == 0 { // 0..5, 7..11, 13..15 owned -> 0..7 owned
		t.Fatalf("sync: %+v %v", ch, err)
	}
	f, _ = Read(ctx, flipper)
	if len(f.Spans) != 2 || f.Spans[1].State != Incoming || f.Spans[1].Lo != lo12 {
		t.Fatalf("incoming range lost: %+v", f.Spans)
	}
}

func TestIntegrationInstallIsIdempotentAndDropsStaleTriggers(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPGNodes(t, 1)
	ctx := ctxT(t)
	c := pg.Nodes[0].Conn(t)
	exec(t, c, eventsDDL)
	exec(t, c, `CREATE TABLE app.other (k bigint PRIMARY KEY)`)
	other := topo.TableRecord{Name: "app.other", KeyColumn: "k"}
	res, err := Install(ctx, c, "c1", "a", []topo.TableRecord{events, other, {Name: "app.nope", KeyColumn: "k"}})
	if err != nil || len(res.Actions) < 4 || len(res.Problems) != 1 || !strings.Contains(res.Problems[0], "app.nope does not exist") {
		t.Fatalf("first install: %+v %v", res, err)
	}
	res, err = Install(ctx, c, "c1", "a", []topo.TableRecord{events, other})
	if err != nil || len(res.Actions) != 0 {
		t.Fatalf("second install changed things: %+v %v", res, err)
	}
	// A disabled or ALWAYS trigger is put right.
	exec(t, c, `ALTER TABLE app.events ENABLE ALWAYS TRIGGER zz_shardvisor_fence`)
	res, err = Install(ctx, c, "c1", "a", []topo.TableRecord{events, other})
	if err != nil || len(res.Actions) != 1 {
		t.Fatalf("re-enable: %+v %v", res, err)
	}
	res, err = Install(ctx, c, "c1", "a", []topo.TableRecord{events})
	if err != nil || len(res.Actions) != 2 || !strings.Contains(strings.Join(res.Actions, ";"), "dropped the fence trigger of app.other") {
		t.Fatalf("unshard app.other: %+v %v", res, err)
	}
	exec(t, c, `INSERT INTO app.other VALUES (1)`) // no longer fenced
}

func TestIntegrationCheckReportsEveryMismatch(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPGNodes(t, 1)
	ctx := ctxT(t)
	m := testMap(t, 4, "a", "b")
	c := prepared(t, pg.Nodes[0], m, "a")
	tables := []topo.TableRecord{events}
	if mm, err := CheckTables(ctx, c, tables); err != nil || len(mm) != 0 {
		t.Fatalf("clean tables: %+v %v", mm, err)
	}
	if mm, err := CheckFence(ctx, c, "c1", tables, m, "a"); err != nil || len(mm) != 0 {
		t.Fatalf("clean fence: %+v %v", mm, err)
	}
	exec(t, c, `CREATE TABLE app.badtype (k integer, id int, PRIMARY KEY (id))`)
	exec(t, c, `CREATE TABLE app.noindex (id bigint PRIMARY KEY, k bigint NOT NULL)`)
	exec(t, c, `CREATE TABLE app.nopk (k bigint)`)
	exec(t, c, `CREATE INDEX ON app.nopk (k) WHERE k > 0`)
	bad := []topo.TableRecord{
		{Name: "app.badtype", KeyColumn: "k"},
		{Name: "app.noindex", KeyColumn: "k"},
		{Name: "app.nopk", KeyColumn: "k"},
		{Name: "app.gone", KeyColumn: "k"},
		{Name: "app.events", KeyColumn: "nokey"},
	}
	mm, err := CheckTables(ctx, c, bad)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, x := range mm {
		got[x.Table+" "+x.Kind] = true
		t.Logf("%s: %s", x.Kind, x.Message)
	}
	for _, want := range []string{
		"app.badtype key-column-type", "app.badtype key-column-nullable", "app.badtype primary-key-without-key-column", "app.badtype key-index-missing",
		"app.noindex key-index-missing", "app.noindex primary-key-without-key-column", "app.nopk primary-key-missing", "app.nopk key-column-nullable", "app.nopk key-index-missing",
		"app.gone table-missing", "app.events key-column-missing",
	} {
		if !got[want] {
			t.Errorf("missing mismatch %q in %v", want, got)
		}
	}
	if len(mm) != 11 {
		t.Errorf("%d mismatches, want 11", len(mm))
	}

	// A drifted fence, a disabled trigger, an edited function, a stray
	// trigger, and a fence behind the map.
	exec(t, c, `UPDATE shardvisor.ownership SET state = 'frozen'`)
	lo, hi, _ := keystream.Range(4, 12)
	exec(t, c, `INSERT INTO shardvisor.ownership VALUES ($1, $2, 'owned', 1)`, lo, hi)
	exec(t, c, `ALTER TABLE app.events DISABLE TRIGGER zz_shardvisor_fence`)
	exec(t, c, `CREATE TRIGGER zz_shardvisor_fence BEFORE INSERT ON app.noindex FOR EACH ROW EXECUTE FUNCTION shardvisor.`+quoteIdent(funcName(events))+`()`)
	next := m.Clone()
	next.Version = 5
	mm, err = CheckFence(ctx, c, "c1", []topo.TableRecord{events}, next, "a")
	if err != nil {
		t.Fatal(err)
	}
	msgs := ""
	for _, x := range mm {
		msgs += x.Kind + ": " + x.Message + "\n"
	}
	for _, want := range []string{
		"fence-range: buckets 0..7 at level 4 (keys -9223372036854775808..-1): the map says owned, the fence says frozen",
		"fence-range: bucket 12 at level 4 (keys 4611686018427387904..5764607523034234879): the map says absent, the fence says owned",
		"trigger-not-enabled: the fence trigger on app.events is disabled",
		"trigger-on-unsharded-table: table app.noindex has a fence trigger",
	} {
		if !strings.Contains(msgs, want) {
			t.Errorf("check output lacks %q:\n%s", want, msgs)
		}
	}
	// A fence behind the map is no drift by itself (a move or a history
	// prune does not sync the nodes it does not involve); one ahead is.
	if strings.Contains(msgs, KindFenceVersion) {
		t.Errorf("a fence behind the map reported:\n%s", msgs)
	}
	exec(t, c, `UPDATE shardvisor.fence_meta SET map_version = 9`)
	mm, err = CheckFence(ctx, c, "c1", []topo.TableRecord{events}, next, "a")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(mm, func(x Mismatch) bool {
		return x.Kind == KindFenceVersion && strings.Contains(x.Message, "the fence is at map version 9, ahead of the map (version 5)")
	}) {
		t.Errorf("a fence ahead of the map not reported: %+v", mm)
	}
	if mm, _ := CheckFence(ctx, c, "c1", nil, m, "b"); len(mm) == 0 || mm[0].Kind != KindFenceWrongNode {
		t.Errorf("wrong node: %+v", mm)
	}
	c2 := pg.Nodes[0].Conn(t)
	exec(t, c2, `DROP SCHEMA shardvisor CASCADE`)
	if mm, _ := CheckFence(ctx, c2, "c1", nil, m, "a"); len(mm) != 1 || mm[0].Kind != KindFenceNotInstalled {
		t.Errorf("not installed: %+v", mm)
	}
}

// A prepared Own is invisible until committed: a writer to the range waits
// for it and then is accepted; after a rollback it is rejected as before.
func TestIntegrationPrepareOwn(t *testing.T) {
	t.Parallel()
	ctx, writer, mover, watcher, lo, hi := soleOwner(t)
	if _, err := SetIncoming(ctx, mover, lo, hi, 2); err != nil {
		t.Fatal(err)
	}
	wantRejected(t, insert(writer, keyIn(4, 6), 1), "still being moved to this node")

	p, err := PrepareOwn(ctx, mover, lo, hi, 3)
	if err != nil {
		t.Fatal(err)
	}
	p.Rollback(ctx)
	wantRejected(t, insert(writer, keyIn(4, 6), 2), "still being moved to this node")
	if f, _ := Read(ctx, watcher); f.MapVersion != 2 {
		t.Fatalf("a rolled-back Own moved the fence to map version %d", f.MapVersion)
	}

	p, err = PrepareOwn(ctx, mover, lo, hi, 3)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- insert(writer, keyIn(4, 6), 3) }()
	waitBlocked(t, watcher, done, "a write went through before the Own was committed")
	if err := p.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the waiting write, after the commit: %v", err)
	}
	f, err := Read(ctx, watcher)
	if err != nil || f.MapVersion != 3 {
		t.Fatalf("fence after the commit: %+v %v", f, err)
	}
	// The newer version makes a sync with the moving map stale.
	if _, err := SetIncoming(ctx, mover, lo, hi, 2); !errors.Is(err, ErrStale) {
		t.Fatalf("a change from an older map after the commit: %v", err)
	}
}

// A node prepared by an older release has the fence constraint without the
// replica test in front of check_row: `node check` accepts it (it fences
// the same writes), and Install replaces it with the current one, which
// still refuses unowned writes and lets replica sessions through without
// calling check_row.
func TestIntegrationInstallUpgradesTheOlderConstraint(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPGNodes(t, 1)
	ctx := ctxT(t)
	m := testMap(t, 4, "a", "b") // a owns 0..7
	c := prepared(t, pg.Nodes[0], m, "a")
	def := func() string {
		var d string
		if err := c.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = $1 AND conrelid = 'app.events'::regclass`, ConstraintName).Scan(&d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := def(); !strings.Contains(d, "session_replication_role") {
		t.Fatalf("a fresh install's constraint: %s", d)
	}
	exec(t, c, `ALTER TABLE app.events DROP CONSTRAINT zz_shardvisor_fence`)
	exec(t, c, `ALTER TABLE app.events ADD CONSTRAINT zz_shardvisor_fence CHECK (shardvisor.check_row(bkey::pg_catalog.int8, tableoid)) NOT VALID`)
	mism, err := CheckFence(ctx, c, "c1", []topo.TableRecord{events}, m, "a")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range mism {
		if x.Kind == KindConstraintWrong || x.Kind == KindConstraintMissing {
			t.Fatalf("the older constraint is reported: %s", x.Message)
		}
	}
	res, err := Install(ctx, c, "c1", "a", []topo.TableRecord{events})
	if err != nil || !strings.Contains(strings.Join(res.Actions, ";"), "added the fence constraint") {
		t.Fatalf("install over the older constraint: %+v %v", res, err)
	}
	if d := def(); !strings.Contains(d, "session_replication_role") || !strings.Contains(d, "check_row") {
		t.Fatalf("the upgraded constraint: %s", d)
	}
	wantRejected(t, insert(c, keyIn(4, 12), 1), "does not own bucket 12")
	if err := insert(c, keyIn(4, 3), 1); err != nil {
		t.Fatalf("owned insert: %v", err)
	}
	exec(t, c, `SET session_replication_role = replica`)
	if err := insert(c, keyIn(4, 12), 2); err != nil {
		t.Fatalf("a replica session's insert: %v", err)
	}
	exec(t, c, `RESET session_replication_role`)
}

// A fence change on a connection of its own is pipelined (BEGIN with the
// reads, COMMIT with the writes): one that fails leaves no transaction
// open and the fence as it was, whether Go refused it after the reads (a
// stale epoch) or the server did in the writes (a lock timeout behind a
// writer in flight). Not parallel: it shortens LockTimeout.
func TestIntegrationFailedPipelinedFlipLeavesNothingOpen(t *testing.T) {
	ctx, writer, changer, _, lo, hi := soleOwner(t)
	idle := func(what string) {
		t.Helper()
		if st := changer.PgConn().TxStatus(); st != 'I' {
			t.Fatalf("after %s the connection is in transaction state %q", what, st)
		}
		f, err := Read(ctx, changer)
		if err != nil || f.MapVersion != 1 || len(f.Spans) != 1 || f.Spans[0].State != Owned {
			t.Fatalf("after %s the fence changed: %+v %v", what, f, err)
		}
	}
	if _, err := Own(ctx, changer, lo, hi, 0); !errors.Is(err, ErrStale) {
		t.Fatalf("an epoch older than the fence's: %v", err)
	}
	idle("a stale change")

	old := LockTimeout
	LockTimeout = 200 * time.Millisecond
	t.Cleanup(func() { LockTimeout = old })
	tx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := insert(writer, keyIn(4, 6), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := FreezeWith(ctx, changer, lo, hi, 2, Stmt{SQL: `SET LOCAL synchronous_commit = on`}); err == nil || !strings.Contains(err.Error(), "draining writers") {
		t.Fatalf("a freeze behind a writer in flight: %v, want a lock timeout", err)
	}
	idle("a lock timeout")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := Freeze(ctx, changer, lo, hi, 2); err != nil {
		t.Fatalf("the freeze once the writer is done: %v", err)
	}
	wantRejected(t, insert(writer, keyIn(4, 6), 2), "frozen")
}
