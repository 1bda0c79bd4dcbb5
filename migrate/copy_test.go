package migrate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/failpoint"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/testkit"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

func TestSplitRange(t *testing.T) {
	const minI, maxI = -1 << 63, 1<<63 - 1
	for _, tc := range []struct {
		lo, hi int64
		parts  int
	}{{0, 9, 3}, {0, 1, 3}, {5, 5, 2}, {minI, maxI, 4}, {minI, minI + 1<<59 - 1, 3}, {-10, 10, 7}, {maxI - 2, maxI, 2}} {
		got := splitRange(tc.lo, tc.hi, tc.parts)
		if len(got) == 0 || len(got) > tc.parts || got[0][0] != tc.lo || got[len(got)-1][1] != tc.hi {
			t.Fatalf("splitRange(%d, %d, %d) = %v", tc.lo, tc.hi, tc.parts, got)
		}
		for i, p := range got {
			if p[0] > p[1] || (i > 0 && p[0] != got[i-1][1]+1) {
				t.Fatalf("splitRange(%d, %d, %d) = %v: part %d", tc.lo, tc.hi, tc.parts, got, i)
			}
		}
		if tc.hi-tc.lo > 1000 && len(got) != tc.parts {
			t.Fatalf("splitRange(%d, %d, %d) = %v: want %d parts", tc.lo, tc.hi, tc.parts, got, tc.parts)
		}
	}
}

// useStreams makes the test's moves copy with n streams, each part of a
// table being at least one row.
func useStreams(t *testing.T, n int) {
	t.Setenv(CopyStreamsEnv, strconv.Itoa(n))
	old := copyRowsPerStream
	copyRowsPerStream = 1
	t.Cleanup(func() { copyRowsPerStream = old })
}

// bulkLoad writes n rows into bucket b's range on node id, straight into
// the table (as replication does), keys spread over the range.
func (f *fixture) bulkLoad(id bucketmap.NodeID, level int, b uint32, prefix string, n int) {
	f.t.Helper()
	lo, hi, _ := keystream.Range(level, b)
	c := f.conn(id)
	ctx := context.Background()
	if _, err := c.Exec(ctx, "SET session_replication_role = replica"); err != nil {
		f.t.Fatal(err)
	}
	defer c.Exec(ctx, "SET session_replication_role = origin")
	if _, err := c.Exec(ctx, fmt.Sprintf(`INSERT INTO app.kv (bkey, uid, v)
		SELECT %d + (i::numeric * %d)::bigint, %s || i, i FROM generate_series(0, %d) i`,
		lo, (uint64(hi)-uint64(lo))/uint64(n), literal(prefix), n-1)); err != nil {
		f.t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "ANALYZE app.kv"); err != nil {
		f.t.Fatal(err)
	}
}

// rangeRows reads bucket b's rows on a node: uid -> v.
func (f *fixture) rangeRows(id bucketmap.NodeID, level int, b uint32) map[string]int64 {
	f.t.Helper()
	lo, hi, _ := keystream.Range(level, b)
	rows, err := f.conn(id).Query(context.Background(), "SELECT uid, v FROM app.kv WHERE bkey BETWEEN $1 AND $2", lo, hi)
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]int64{}
	n := 0
	for rows.Next() {
		var uid string
		var v int64
		if err := rows.Scan(&uid, &v); err != nil {
			f.t.Fatal(err)
		}
		out[uid] = v
		n++
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	if n != len(out) {
		f.t.Fatalf("%s: %d rows for %d users in bucket %d", id, n, len(out), b)
	}
	return out
}

// The copy reads one snapshot, the slot's: rows written on the source
// while it runs (inserted, updated, deleted, before and during the copy's
// own COPYs) reach the target once through the subscription, and none is
// lost or copied twice.
func TestIntegrationCopyReadsOneSnapshot(t *testing.T) {
	f := newFixture(t, 2, 2) // 4 buckets: pg1 0-1, pg2 2-3
	useStreams(t, 3)
	ctx := context.Background()
	const bulk = 30000
	f.bulkLoad("pg1", 2, 0, "bulk-", bulk)
	lo, hi, _ := keystream.Range(2, 0)
	step := (uint64(hi) - uint64(lo)) / bulk
	keyOf := func(i int) int64 { return int64(uint64(lo) + uint64(i)*step) }
	src := f.conn("pg1")

	// A writer on the source, through its fence, from before the copy
	// until the move enters catchup: updates, deletes and inserts of the
	// bucket's rows, spread over every part of the range.
	var (
		stop        = make(chan struct{})
		wg          sync.WaitGroup
		writes      atomic.Int64
		duringCopy  atomic.Int64
		copying     atomic.Bool
		writerErr   atomic.Pointer[string]
		writerConns = f.conn("pg1")
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		testkit.Until(stop, func(i int) bool {
			k := (i * 7919) % bulk
			var err error
			switch i % 3 {
			case 0:
				_, err = writerConns.Exec(ctx, "UPDATE app.kv SET v = v + 1000000 WHERE bkey = $1 AND uid = $2", keyOf(k), "bulk-"+strconv.Itoa(k))
			case 1:
				_, err = writerConns.Exec(ctx, "DELETE FROM app.kv WHERE bkey = $1 AND uid = $2", keyOf(k), "bulk-"+strconv.Itoa(k))
			case 2:
				_, err = writerConns.Exec(ctx, "INSERT INTO app.kv (bkey, uid, v) VALUES ($1, $2, $3)", keyOf(k)+1, "new-"+strconv.Itoa(i), i)
			}
			if err != nil {
				msg := err.Error()
				writerErr.Store(&msg)
				return false
			}
			writes.Add(1)
			if copying.Load() {
				duringCopy.Add(1)
			}
			return true
		})
	}()
	testenv.WaitFor(t, 30*time.Second, func() bool { return writes.Load() >= 50 }, "writes before the move")

	var hookWrites int64
	copyTestHook = func() {
		// The streams hold the snapshot: rows written now are not in it.
		for i := range 30 {
			k := (i*104729 + 11) % bulk
			if _, err := src.Exec(ctx, "UPDATE app.kv SET v = -1 WHERE bkey = $1 AND uid = $2", keyOf(k), "bulk-"+strconv.Itoa(k)); err != nil {
				t.Error(err)
			}
			if _, err := src.Exec(ctx, "INSERT INTO app.kv (bkey, uid, v) VALUES ($1, $2, 7)", keyOf(k)+2, "hook-"+strconv.Itoa(i)); err != nil {
				t.Error(err)
			}
			hookWrites += 2
		}
		copying.Store(true)
	}
	t.Cleanup(func() { copyTestHook = nil })
	mv := f.mover(Options{})
	var stopOnce sync.Once
	stopWriter := func() {
		stopOnce.Do(func() {
			close(stop)
			wg.Wait()
		})
	}
	defer stopWriter()
	mv.opts.Progress = func(p Progress) {
		if p.Message == topo.MoveCatchup {
			copying.Store(false)
			stopWriter() // before the fence freezes the range
		}
	}
	rec, err := mv.Move(ctx, 0, "pg2", false)
	if err != nil {
		t.Fatalf("move: %v (%+v)", err, rec)
	}
	if p := writerErr.Load(); p != nil {
		t.Fatalf("writer: %s", *p)
	}
	t.Logf("%d rows copied in %.0f ms; %d writes by the writer (%d while the streams copied), %d by the hook", rec.Stats.RowsCopied, rec.Stats.CopyMS, writes.Load(), duringCopy.Load(), hookWrites)
	if hookWrites != 60 || duringCopy.Load() == 0 {
		t.Fatalf("no write while copying (hook %d, writer %d)", hookWrites, duringCopy.Load())
	}
	if rec.State != topo.MoveDone || rec.Verify == nil || !rec.Verify.OK || rec.Verify.Inconclusive {
		t.Fatalf("move ended %s, verify %+v", rec.State, rec.Verify)
	}
	// The source is frozen since the fence: both copies must be equal.
	want, got := f.rangeRows("pg1", 2, 0), f.rangeRows("pg2", 2, 0)
	if len(want) != len(got) {
		t.Errorf("source has %d rows in bucket 0, target %d", len(want), len(got))
	}
	bad := 0
	for uid, v := range want {
		if g, ok := got[uid]; !ok || g != v {
			if bad++; bad <= 5 {
				t.Errorf("%s: source v=%d, target %d (present %v)", uid, v, g, ok)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d rows differ", bad)
	}
	if got["hook-0"] != 7 {
		t.Fatalf("a row inserted after the snapshot is missing on the target")
	}
	f.checkClean(nil)
}

// Generated columns are not copied (COPY refuses them, and replication
// does not carry them): the target computes them.
func TestIntegrationCopySkipsGeneratedColumns(t *testing.T) {
	f := newFixture(t, 2, 2)
	useStreams(t, 2)
	ctx := context.Background()
	for _, n := range []bucketmap.NodeID{"pg1", "pg2"} {
		if _, err := f.conn(n).Exec(ctx, `ALTER TABLE app.kv ADD COLUMN twice bigint GENERATED ALWAYS AS (v * 2) STORED`); err != nil {
			t.Fatal(err)
		}
	}
	seeded := f.seedRows("s", 60)
	f.bulkLoad("pg1", 2, 0, "bulk-", 500)
	rec, err := f.mover(Options{}).Move(ctx, 0, "pg2", false)
	if err != nil || rec.State != topo.MoveDone || !rec.Verify.OK {
		t.Fatalf("move of a table with a generated column: %v (%+v)", err, rec)
	}
	lo, hi, _ := keystream.Range(2, 0)
	var n, wrong int64
	if err := f.conn("pg2").QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE twice IS DISTINCT FROM v * 2) FROM app.kv WHERE bkey BETWEEN $1 AND $2", lo, hi).Scan(&n, &wrong); err != nil {
		t.Fatal(err)
	}
	if n < 500 || wrong != 0 || n != rec.Stats.RowsCopied {
		t.Fatalf("target: %d rows (%d copied), %d with a wrong generated value", n, rec.Stats.RowsCopied, wrong)
	}
	f.checkClean(seeded)
}

// A row the target refuses (a constraint only it has) in one part of a
// copy made of several stops the move with the table, the row's primary
// key and PostgreSQL's error; nothing of the copy is left.
func TestIntegrationCopyRefusedRowInAPart(t *testing.T) {
	f := newFixture(t, 2, 2)
	useStreams(t, 3)
	ctx := context.Background()
	seeded := f.seedRows("s", 40)
	f.bulkLoad("pg1", 2, 0, "bulk-", 3000)
	lo, hi, _ := keystream.Range(2, 0)
	bad := int64(uint64(lo) + (uint64(hi)-uint64(lo))/3*2 + 12345) // in the last part
	if _, err := f.conn("pg1").Exec(ctx, `INSERT INTO app.kv (bkey, uid, v) VALUES ($1, 'too-big', 5000000)`, bad); err != nil {
		t.Fatal(err)
	}
	// Both nodes have the constraint (one only the target has refuses the
	// move before the copy); the source added it NOT VALID, after the row
	// that breaks it.
	if _, err := f.conn("pg1").Exec(ctx, `ALTER TABLE app.kv ADD CONSTRAINT small_v CHECK (v < 1000000) NOT VALID`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.conn("pg2").Exec(ctx, `ALTER TABLE app.kv ADD CONSTRAINT small_v CHECK (v < 1000000)`); err != nil {
		t.Fatal(err)
	}
	rec, err := f.mover(Options{}).Move(ctx, 0, "pg2", false)
	if err == nil || rec.State != topo.MoveAborted {
		t.Fatalf("move into a target that refuses a row: %v (state %s)", err, rec.State)
	}
	t.Logf("error: %s", rec.Error)
	for _, want := range []string{"during the initial copy", "table app.kv, row (bkey, uid) = (" + strconv.FormatInt(bad, 10) + ", 'too-big')", `violates check constraint "small_v"`, "SQLSTATE 23514"} {
		if !strings.Contains(rec.Error, want) {
			t.Errorf("the record's error %q lacks %q", rec.Error, want)
		}
	}
	if n := f.rowsIn("pg2", 2, 0); n != 0 {
		t.Fatalf("%d copied rows left on the target", n)
	}
	if _, err := f.conn("pg1").Exec(ctx, `DELETE FROM app.kv WHERE uid = 'too-big'`); err != nil {
		t.Fatal(err)
	}
	f.checkClean(seeded)
}

// A mover killed in copy, after its rows were committed on the target (its
// subscription still disabled, or already enabled), is resumed in copy and
// starts the copy over: the leftover subscription and slot are dropped,
// the target's range cleared, and the copy made again from a new slot's
// snapshot, with rows written since the kill; its record's copy time and
// rows are those of the new copy.
func TestFaultsMoverKilledInCopyStartsOver(t *testing.T) {
	testenv.Faults(t) // kills and session expiries: make test-faults
	bin := shardctlBin(t)
	f := newFixture(t, 3, 2) // 8 buckets: pg1 0-3
	seeded := f.seedRows("s", 200)
	ctx := context.Background()
	zkArgs := []string{"--zk", f.z.ConnectString, "--zk-root", f.z.Root, "--cluster", "mv"}
	for b, point := range []string{crashCopied, crashCopyEnabled} {
		b := uint32(b)
		f.bulkLoad("pg1", 3, b, "bulk-", 5000)
		before := f.rowsIn("pg1", 3, b)
		cmd := exec.Command(bin, append(append([]string{}, zkArgs...), "--zk-session-timeout", "3s", "move", fmt.Sprint(b), "--to", "pg2", "--window", "0")...)
		cmd.Env = append(os.Environ(), failpoint.Env+"="+failpointPrefix+point, CopyStreamsEnv+"=2")
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != -1 {
			t.Fatalf("crash at %s: the mover was not killed: %v\n%s", point, err, out)
		}
		if err := topo.Sync(ctx, f.s, f.st.Paths()); err != nil {
			t.Fatal(err)
		}
		var id string
		list, _ := f.mover(Options{}).List(ctx)
		for _, r := range list {
			if r.Bucket == b && !r.Finished() {
				id = r.ID
				if r.State != topo.MoveCopy {
					t.Fatalf("killed at %s: the record says %s", point, r.State)
				}
			}
		}
		if id == "" {
			t.Fatalf("crash at %s: no unfinished move of bucket %d", point, b)
		}
		rec0, _ := f.mover(Options{}).Get(ctx, id)
		// What the killed copy left: its slot, its subscription, its rows.
		if ok, err := slotExists(ctx, f.conn("pg1"), rec0.Slot); err != nil || !ok {
			t.Fatalf("killed at %s: no slot on the source (%v)", point, err)
		}
		var enabled bool
		if err := f.conn("pg2").QueryRow(ctx, "SELECT subenabled FROM pg_subscription WHERE subname = $1", rec0.Subscription).Scan(&enabled); err != nil {
			t.Fatalf("killed at %s: subscription: %v", point, err)
		}
		if enabled != (point == crashCopyEnabled) {
			t.Fatalf("killed at %s: subscription enabled %v", point, enabled)
		}
		if n := f.rowsIn("pg2", 3, b); n != before {
			t.Fatalf("killed at %s: %d rows on the target, %d on the source", point, n, before)
		}
		// Rows written after the kill: the new copy must have them, once.
		if _, err := f.conn("pg1").Exec(ctx, "UPDATE app.kv SET v = v + 1 WHERE uid LIKE 'bulk-1%' AND bkey BETWEEN $1 AND $2", rec0.Lo, rec0.Hi); err != nil {
			t.Fatal(err)
		}
		f.bulkLoad("pg1", 3, b, "later-", 100)
		var rec *topo.MoveRecord
		start := time.Now()
		deadline := start.Add(30 * time.Second)
		for {
			rec, err = f.mover(Options{}).Resume(ctx, id)
			if !errors.Is(err, ErrBusy) || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil || rec.State != topo.MoveDone || rec.Verify == nil || !rec.Verify.OK || rec.Verify.Inconclusive {
			t.Fatalf("killed at %s, resumed: %v (%+v)", point, err, rec)
		}
		after := f.rowsIn("pg1", 3, b)
		if rec.Stats.RowsCopied != after || f.rowsIn("pg2", 3, b) != after {
			t.Fatalf("killed at %s: %d rows copied on resume, %d on the target, %d on the source", point, rec.Stats.RowsCopied, f.rowsIn("pg2", 3, b), after)
		}
		if rec.Stats.CopyMS <= 0 || rec.Stats.CopyMS > float64(time.Since(start).Milliseconds()) {
			t.Fatalf("killed at %s: copy time %.1f ms", point, rec.Stats.CopyMS)
		}
		t.Logf("killed at %-12s -> %s: %d rows copied again in %.0f ms", point, rec.State, rec.Stats.RowsCopied, rec.Stats.CopyMS)
		if f.mapNow().Owner(b) != "pg2" {
			t.Fatalf("bucket %d is not on pg2", b)
		}
		f.checkClean(seeded)
	}
}
