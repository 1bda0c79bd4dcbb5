package migrate

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/failpoint"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// rollbackOf finds the rollback move of move id.
func (f *fixture) rollbackOf(mv *Mover, id string) *topo.MoveRecord {
	f.t.Helper()
	list, err := mv.List(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	for _, r := range list {
		if r.RollbackOf == id {
			return r
		}
	}
	f.t.Fatalf("move %s has no rollback move", id)
	return nil
}

// A move in its rollback window keeps the old owner in step; a rollback
// under load gives the bucket back with every write made on the new owner
// since the flip, and leaves no replication object behind.
func TestIntegrationRollbackKeepsEveryWrite(t *testing.T) {
	f := parallelFixture(t, 3, 2) // 8 buckets: pg1 0-3, pg2 4-7
	base := f.seedRows("seed", 400)
	l := f.startLoad(6, 200)
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= 20 }, "writes acknowledged before the move")
	ctx := context.Background()
	mv := f.mover(Options{Window: 10 * time.Minute})
	rec, err := mv.Move(ctx, 1, "pg2", false)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != topo.MoveReversible || rec.Verify == nil || !rec.Verify.OK || rec.Reverse == nil || !rec.Reverse.Enabled || rec.Reverse.Until == nil {
		t.Fatalf("move ended %s, verify %+v, reverse %+v, error %q", rec.State, rec.Verify, rec.Reverse, rec.Error)
	}
	if m := f.mapNow(); m.Owner(1) != "pg2" {
		t.Fatalf("bucket 1 is on %s in the window", m.Owner(1))
	}
	// The bucket cannot move again while its window is open.
	if _, err := mv.Move(ctx, 1, "pg1", false); err == nil || !strings.Contains(err.Error(), "rollback window") {
		t.Fatalf("a second move in the window: %v", err)
	}
	// Writes on the new owner, which the reverse stream brings back.
	n := l.writes.Load()
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= n+200 }, "writes acknowledged in the window")

	out, err := mv.Rollback(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != topo.MoveRolledBack {
		t.Fatalf("rolled-back move is %s: %s", out.State, out.Error)
	}
	rb := f.rollbackOf(mv, rec.ID)
	if rb.State != topo.MoveDone || rb.Source != "pg2" || rb.Target != "pg1" || rb.FlipVersion == 0 {
		t.Fatalf("rollback move %s: %s %s -> %s flip %d (%s)", rb.ID, rb.State, rb.Source, rb.Target, rb.FlipVersion, rb.Error)
	}
	m := f.mapNow()
	if m.Owner(1) != "pg1" || m.Meta(1).State != bucketmap.BucketActive {
		t.Fatalf("bucket 1 after the rollback: %s %+v", m.Owner(1), m.Meta(1))
	}
	// GC may prune pg2's copy once safe, never pg1's.
	h := m.HistoryOf(1)
	if !slices.ContainsFunc(h, func(x bucketmap.Handoff) bool { return x.Node == "pg2" && x.UntilVersion == rb.FlipVersion }) ||
		slices.ContainsFunc(h, func(x bucketmap.Handoff) bool { return x.Node == "pg1" }) {
		t.Fatalf("history after the rollback %+v", h)
	}
	n = l.writes.Load()
	testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= n+20 }, "writes acknowledged after the rollback")
	acked := l.finish()
	t.Logf("move pause %.1f ms, rollback pause %.1f ms; %d writes acknowledged, %d gave up", rec.Stats.PauseMS, rb.Stats.PauseMS, l.writes.Load(), l.failed.Load())
	if l.failed.Load() > 0 {
		t.Fatalf("%d writes failed: %s", l.failed.Load(), *l.lastErr.Load())
	}
	withSeeded(acked, base)
	f.checkAcked(acked, l.maybe)
	if left := f.leftovers(); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
	if _, err := f.conn("pg2").Exec(ctx, "INSERT INTO app.kv VALUES ($1, 'late', 1)", rec.Lo); err == nil || !strings.Contains(err.Error(), "SV001") {
		t.Fatalf("a late write to the node the bucket left: %v", err)
	}
	if _, err := mv.Rollback(ctx, rec.ID); err != nil {
		t.Fatalf("a second rollback of a rolled-back move: %v", err)
	}
}

// `move complete` ends the window at once; a window that runs out is ended
// by the orphan watcher. Either way nothing of the reverse stream stays.
func TestIntegrationMoveCompleteEndsWindow(t *testing.T) {
	f := parallelFixture(t, 3, 2)
	f.seedRows("seed", 200)
	ctx := context.Background()
	mv := f.mover(Options{Window: 10 * time.Minute})
	rec, err := mv.Move(ctx, 1, "pg2", false)
	if err != nil || rec.State != topo.MoveReversible {
		t.Fatalf("move: %v (%+v)", err, rec)
	}
	if left := f.leftovers(); len(left) != 3 {
		t.Fatalf("in the window, want the reverse stream (publication and slot on pg2, subscription on pg1): %v", left)
	}
	if out, err := mv.Complete(ctx, rec.ID); err != nil || out.State != topo.MoveDone {
		t.Fatalf("complete: %v (%+v)", err, out)
	}
	if left := f.leftovers(); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
	if _, err := mv.Rollback(ctx, rec.ID); !errors.Is(err, ErrNoRollback) {
		t.Fatalf("rollback of a completed move: %v", err)
	}

	short := f.mover(Options{Window: time.Second})
	rec, err = short.Move(ctx, 2, "pg2", false)
	if err != nil || rec.State != topo.MoveReversible {
		t.Fatalf("move: %v (%+v)", err, rec)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watcher := f.mover(Options{})
	done := make(chan struct{})
	go func() { defer close(done); watcher.WatchOrphans(wctx) }()
	testenv.WaitFor(t, 30*time.Second, func() bool {
		r, err := mv.Get(ctx, rec.ID)
		return err == nil && r.State == topo.MoveDone
	}, "the watcher completing the move whose window ran out")
	cancel()
	<-done
	if left := f.leftovers(); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// divergingTargets are targets whose copy differs: a trigger enabled for
// replication drops, changes or adds a row (%s: the victim's uid).
var divergingTargets = []struct {
	name, body, when, want string
}{
	{"drops", `IF NEW.uid = '%s' THEN RETURN NULL; END IF; RETURN NEW;`, "BEFORE", "missing on target"},
	{"changes", `IF NEW.uid = '%s' THEN NEW.v := NEW.v + 1000; END IF; RETURN NEW;`, "BEFORE", "differs"},
	{"gains", `IF NEW.uid = '%s' THEN INSERT INTO app.kv VALUES (NEW.bkey, NEW.uid || '-ghost', 0) ON CONFLICT DO NOTHING; END IF; RETURN NULL;`, "AFTER", "only on target"},
}

// A target whose copy differs never keeps the bucket: verification finds
// it, says which table, chunk and row, and the move is rolled back with
// every write made since the flip. make test runs the first case, the
// fault run the other two (TestFaultsDivergingTargetRollsBack).
func TestIntegrationDivergingTargetRollsBack(t *testing.T) {
	t.Parallel()
	testDivergingTargets(t, divergingTargets[:1])
}

func TestFaultsDivergingTargetRollsBack(t *testing.T) {
	testenv.Faults(t)
	testDivergingTargets(t, divergingTargets[1:])
}

func testDivergingTargets(t *testing.T, cases []struct{ name, body, when, want string }) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 3, 2)
			base := f.seedRows("seed", 400)
			victim := ""
			m := f.mapNow()
			for i := 0; victim == ""; i++ {
				if uid := "seed-" + strconv.Itoa(i); m.BucketOf(f.ks, uid).Prefix == 1 {
					victim = uid
				}
			}
			ctx := context.Background()
			if _, err := f.conn("pg2").Exec(ctx, `CREATE FUNCTION app.bad() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN `+
				strings.ReplaceAll(tc.body, "%s", victim)+` END $$;
				CREATE TRIGGER bad `+tc.when+` INSERT ON app.kv FOR EACH ROW EXECUTE FUNCTION app.bad();
				ALTER TABLE app.kv ENABLE ALWAYS TRIGGER bad`); err != nil {
				t.Fatal(err)
			}
			l := f.startLoad(4, 100)
			testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= 20 }, "writes acknowledged before the move")
			mv := f.mover(Options{})
			rec, err := mv.Move(ctx, 1, "pg2", false)
			if !errors.Is(err, ErrVerifyMismatch) {
				t.Fatalf("move over a target that %s a row: %v (%+v)", tc.name, err, rec)
			}
			if rec.State != topo.MoveRolledBack || rec.Verify == nil || rec.Verify.OK {
				t.Fatalf("move ended %s, verify %+v", rec.State, rec.Verify)
			}
			if len(rec.Verify.Chunks) == 0 || !strings.Contains(strings.Join(rec.Verify.Chunks[0].Rows, "; "), tc.want) ||
				!strings.Contains(strings.Join(rec.Verify.Chunks[0].Rows, "; "), victim) {
				t.Fatalf("the record does not say what differs: %+v", rec.Verify.Chunks)
			}
			t.Logf("error: %v", err)
			if m := f.mapNow(); m.Owner(1) != "pg1" || m.Meta(1).State != bucketmap.BucketActive {
				t.Fatalf("bucket 1 after the rollback: %s %+v", m.Owner(1), m.Meta(1))
			}
			n := l.writes.Load()
			testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= n+20 }, "writes acknowledged after the rollback")
			acked := l.finish()
			withSeeded(acked, base)
			f.checkAcked(acked, l.maybe)
			if left := f.leftovers(); len(left) > 0 {
				t.Fatalf("left behind: %v", left)
			}
		})
	}
}

// A `shardctl move rollback` SIGKILLed on entering each state of its
// rollback move, under a write load, with `rebalance --watch` running: the
// watcher finishes the rollback move, or aborts it (inside the pause) and
// starts the rollback again, since the move still wants it. Every move ends
// rolled back, its bucket on the old owner, with no acknowledged write lost
// and nothing left behind.
func TestFaultsWatcherHealsRollbackKilledInEveryState(t *testing.T) {
	testenv.Faults(t)
	f := newFixture(t, 4, 2) // 16 buckets: pg1 0-7
	seeded := f.seedRows("s", 300)
	ctx := context.Background()
	f.watcher(ctx, 4*time.Second)
	l := f.startLoad(4, 40)
	const sessionTimeout = 3 * time.Second
	b := uint32(0)
	for _, state := range []string{topo.MoveFence, topo.MoveBarrier, topo.MoveFlip, crashFlipped, topo.MoveTeardown, topo.MoveVerify} {
		rec, err := f.mover(Options{Window: 10 * time.Minute}).Move(ctx, b, "pg2", false)
		if err != nil || rec.State != topo.MoveReversible {
			t.Fatalf("move of bucket %d: %v (%+v)", b, err, rec)
		}
		cmd := exec.Command(shardctlBin(t), "--zk", f.z.ConnectString, "--zk-root", f.z.Root, "--cluster", "mv",
			"--zk-session-timeout", sessionTimeout.String(), "move", "rollback", rec.ID)
		cmd.Env = append(os.Environ(), failpoint.Env+"="+failpointPrefix+state)
		out, err := cmd.CombinedOutput()
		dead := time.Now()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != -1 {
			t.Fatalf("the rollback was not killed at %s: %v\n%s", state, err, out)
		}
		bound := sessionTimeout + OrphanGrace + 3*time.Second
		var got *topo.MoveRecord
		for {
			if err := topo.Sync(ctx, f.s, f.st.Paths()); err != nil {
				t.Fatal(err)
			}
			if got, err = f.mover(Options{}).Get(ctx, rec.ID); err != nil {
				t.Fatal(err)
			}
			if got.Finished() {
				break
			}
			if time.Since(dead) > 2*bound+5*time.Second {
				t.Fatalf("rollback killed on entering %s: move %s still %s %s after the kill (%+v)", state, rec.ID, got.State, time.Since(dead).Round(time.Millisecond), got.Reverse)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if got.State != topo.MoveRolledBack {
			t.Fatalf("rollback killed on entering %s: move %s ended %s (%s)", state, rec.ID, got.State, got.Error)
		}
		if owner := f.mapNow().Owner(b); owner != "pg1" {
			t.Fatalf("rollback killed on entering %s: bucket %d is on %s", state, b, owner)
		}
		// Its rollback moves all finished, the last one done.
		testenv.WaitFor(t, 2*bound, func() bool {
			list, err := f.mover(Options{}).List(ctx)
			if err != nil {
				return false
			}
			for _, r := range list {
				if r.RollbackOf == rec.ID && !r.Finished() {
					return false
				}
			}
			return true
		}, "the rollback moves finished")
		t.Logf("rollback killed on entering %-9s -> %s by the watcher %s after the kill (rollback %s)", state, got.State,
			time.Since(dead).Round(time.Millisecond), got.Reverse.Rollback)
		if left := f.leftovers(); len(left) > 0 {
			t.Fatalf("rollback killed at %s: left behind: %v", state, left)
		}
		b++
	}
	acked := l.finish()
	t.Logf("load: %d writes acknowledged, %d failed", l.writes.Load(), l.failed.Load())
	withSeeded(acked, seeded)
	f.checkAcked(acked, l.maybe)
}

// Verification sees every difference in the rows, also those a type's
// own equality (and hash) ignores and those that only move a value from
// one row to another, for any column type: the range against itself
// agrees, and each of these targets differs from the source in exactly one
// place, which is found, with its row.
func TestIntegrationVerifyCatchesEveryDifference(t *testing.T) {
	t.Parallel()
	tables := []topo.TableRecord{{Name: "app.geo", KeyColumn: "bkey"}, kvTable}
	ddl := kvDDL + `; CREATE TABLE IF NOT EXISTS app.geo (bkey bigint NOT NULL, id int NOT NULL, p point, note text, amount numeric, f float8,
		PRIMARY KEY (bkey, id))`
	sc, dc, lo, _ := sequenceScene(t, tables, ddl)
	ctx := context.Background()
	const rows = `SELECT $1::bigint + g, g, point(g, -g), 'note ' || g, 1.5 * g, 0.25 * g FROM generate_series(1, 200) g`
	if _, err := sc.Exec(ctx, `INSERT INTO app.geo `+rows, lo); err != nil {
		t.Fatal(err)
	}
	sc2, err := pgx.ConnectConfig(ctx, sc.Config().Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer sc2.Close(ctx)
	chk, serr, derr := compareRange(ctx, sc, sc2, tables, lo, lo+1000)
	if serr != nil || derr != nil || !chk.OK {
		t.Fatalf("a range against itself: %+v %v %v", chk, serr, derr)
	}
	for _, tc := range []struct{ name, change, want string }{
		{"a point", `UPDATE app.geo SET p = point(7, 0) WHERE id = 7`, `"id": 7`},
		{"two rows swap a value", `UPDATE app.geo SET note = CASE id WHEN 3 THEN 'note 4' ELSE 'note 3' END WHERE id IN (3, 4)`, `"id": 3`},
		{"numeric scale", `UPDATE app.geo SET amount = 3.00 WHERE id = 2`, `"id": 2`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := dc.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range []string{`SET LOCAL session_replication_role = replica`, `DELETE FROM app.geo`} {
				if _, err := tx.Exec(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO app.geo `+rows, lo); err != nil {
				t.Fatal(err)
			}
			for _, q := range strings.Split(tc.change, "; ") {
				if _, err := tx.Exec(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			chk, serr, derr := compareRange(ctx, sc, dc, tables, lo, lo+1000)
			if serr != nil || derr != nil {
				t.Fatal(serr, derr)
			}
			if chk.OK || len(chk.Chunks) == 0 || chk.Chunks[0].Table != "app.geo" || !strings.Contains(strings.Join(chk.Chunks[0].Rows, " "), tc.want) {
				t.Fatalf("%s: %+v", tc.name, chk)
			}
			t.Logf("%s: %s", tc.name, describe(chk))
		})
	}
	// The float's sign: -0 = 0 for float8's equality and hash, not here.
	if _, err := dc.Exec(ctx, `BEGIN; SET LOCAL session_replication_role = replica; UPDATE app.geo SET f = '-0' WHERE id = 9; COMMIT`); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Exec(ctx, `UPDATE app.geo SET f = 0 WHERE id = 9`); err != nil {
		t.Fatal(err)
	}
	if chk, _, _ := compareRange(ctx, sc, dc, tables, lo, lo+1000); chk == nil || chk.OK {
		t.Fatalf("-0 against 0: %+v", chk)
	}
}

// The old owner dies inside the window. The new owner keeps serving the
// bucket; a rollback waits for the old owner (nothing changes);
// `move complete` drops the new owner's reverse slot at once, so that it
// holds no WAL for a node that is away, and the move stays completing
// until the old owner answers; then a resume drops its subscription and
// the move is done, nothing left behind, every write on the owner.
func TestFaultsOldOwnerDownInWindow(t *testing.T) {
	testenv.Faults(t)
	testenv.Exclusive(t)
	f := newFixture(t, 3, 2)
	base := f.seedRows("seed", 200)
	ctx := context.Background()
	mv := f.mover(Options{Window: 10 * time.Minute, AbortRetry: time.Second})
	rec, err := mv.Move(ctx, 1, "pg2", false)
	if err != nil || rec.State != topo.MoveReversible {
		t.Fatalf("move: %v (%+v)", err, rec)
	}
	old := f.pg.Nodes[0] // pg1
	if err := old.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = old.Start() })
	uid := f.uidIn(f.mapNow(), 1, "down")
	for v := int64(1); v <= 20; v++ {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f.write(wctx, uid, v)
		cancel()
		if err != nil {
			t.Fatalf("a write to the moved bucket with its old owner down: %v", err)
		}
	}
	base[uid] = 20
	if out, err := mv.Rollback(ctx, rec.ID); err == nil || out.State != topo.MoveReversible {
		t.Fatalf("a rollback with the old owner down: %v (%s)", err, out.State)
	}
	out, err := mv.Complete(ctx, rec.ID)
	if err == nil || out.State != topo.MoveCompleting || !strings.Contains(err.Error(), "source unreachable") {
		t.Fatalf("complete with the old owner down: %v (%s)", err, out.State)
	}
	if ok, err := slotExists(ctx, f.conn("pg2"), rec.Reverse.Slot); err != nil || ok {
		t.Fatalf("the new owner keeps the reverse slot for a node that is away: %v %v", ok, err)
	}
	t.Logf("with the old owner down: %v", err)
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	out, err = f.mover(Options{}).Resume(ctx, rec.ID)
	if err != nil || out.State != topo.MoveDone {
		t.Fatalf("resume once the old owner is back: %v (%s)", err, out.State)
	}
	if left := f.leftovers(); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
	f.checkAcked(base, nil)
}
