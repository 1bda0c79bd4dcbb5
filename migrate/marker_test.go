package migrate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// A marker that logical replication applies on the target wakes a waiter
// through the marker table's trigger: waitMarker, given a fallback poll
// longer than the test, returns only because the apply worker's commit
// notified it. The source's own insert notifies no one.
func TestIntegrationMarkerAppliedNotifies(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPGNodes(t, 2)
	nodes := clustertest.NodesOf(pg, "pg")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	connect := func(i int) *pgx.Conn {
		c, err := dbnode.Connect(ctx, nodes[i])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	src, dst, dstWait, srcListen := connect(0), connect(1), connect(1), connect(0)
	for _, c := range []*pgx.Conn{src, dst, dst} { // twice: idempotent
		if err := ensureMarker(ctx, c); err != nil {
			t.Fatalf("ensureMarker: %v", err)
		}
	}
	var triggers int
	if err := dst.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'shardvisor.move_marker'::regclass AND tgname = 'move_marker_notify' AND tgenabled = 'A'`).Scan(&triggers); err != nil || triggers != 1 {
		t.Fatalf("the marker table's ALWAYS trigger: %d (%v), want 1", triggers, err)
	}

	name := fmt.Sprintf("marker_test_%d", time.Now().UnixNano())
	if _, err := src.Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE shardvisor.move_marker", name)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+name) })
	conninfo, err := dbnode.ConnString(nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dst.Exec(ctx, fmt.Sprintf("CREATE SUBSCRIPTION %s CONNECTION %s PUBLICATION %s WITH (copy_data = false)", name, literal(conninfo), name)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Exec(context.Background(), "DROP SUBSCRIPTION IF EXISTS "+name) })
	if _, err := srcListen.Exec(ctx, "LISTEN "+markerChannel); err != nil {
		t.Fatal(err)
	}

	// The first marker only proves the stream runs (a subscription's
	// worker starts asynchronously); the second is waited for by
	// notification alone.
	if _, err := insertMarker(ctx, src, "m", 1); err != nil {
		t.Fatal(err)
	}
	if err := waitMarker(ctx, dst, "m", 1, 10*time.Millisecond); err != nil {
		t.Fatalf("first marker: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- waitMarker(ctx, dstWait, "m", 2, time.Hour) }()
	waited := false
	defer func() {
		if !waited { // a Fatal below: the waiter holds dstWait until it returns
			cancel()
			<-done
		}
	}()
	// Let the waiter check once and block before the marker is sent;
	// sending it earlier would be found by that check, proving nothing
	// (the test would pass either way, never flake).
	time.Sleep(200 * time.Millisecond)
	if _, err := insertMarker(ctx, src, "m", 2); err != nil {
		t.Fatal(err)
	}
	err = <-done
	waited = true
	if err != nil {
		t.Fatalf("waiting for marker 2 by notification (its poll is an hour): %v", err)
	}

	// A forged notification (anyone who can connect may NOTIFY) for a
	// marker that never comes wakes the waiter, which asks the table and
	// waits on: it does not return before its deadline.
	forger := connect(1)
	fctx, fcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	forged := make(chan error, 1)
	go func() { forged <- waitMarker(fctx, dstWait, "m", 3, time.Hour) }()
	for range 5 {
		if _, err := forger.Exec(ctx, "SELECT pg_notify($1, 'm:3')", markerChannel); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	err = <-forged
	fcancel()
	if err == nil {
		t.Fatal("a forged notification ended the wait for a marker that was never applied")
	}

	// The sync point ends the listening (before the verification
	// snapshot's long transaction on the same connection).
	listening := func() []string {
		rows, err := dstWait.Query(ctx, "SELECT pg_listening_channels()")
		if err != nil {
			t.Fatal(err)
		}
		ch, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	if ch := listening(); len(ch) != 1 || ch[0] != markerChannel {
		t.Fatalf("the waiting connection listens on %v, want [%s]", ch, markerChannel)
	}
	if err := syncPoint(ctx, dstWait); err != nil {
		t.Fatal(err)
	}
	if ch := listening(); len(ch) != 0 {
		t.Fatalf("after the sync point the connection still listens on %v", ch)
	}

	// The source's listener has been idle since both inserts committed:
	// a notification of theirs would be in its queue after one more
	// round trip.
	if _, err := srcListen.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer wcancel()
	if n, err := srcListen.WaitForNotification(wctx); err == nil {
		t.Fatalf("the source's own marker insert notified %q", n.Payload)
	}
}
