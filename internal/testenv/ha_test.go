package testenv

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestFaultsGroupFailover kills a Patroni group's primary under a stream of
// synchronously committed single-row inserts through the group's multi-host
// DSN, and checks that a standby takes over without losing any acknowledged
// insert, and that the killed member rejoins as a standby.
func TestFaultsGroupFailover(t *testing.T) {
	Faults(t)
	Exclusive(t)
	pg := StartPGGroups(t, 1)
	g := pg.Nodes[0]
	ctx := t.Context()
	if len(g.Members) != GroupMembers || len(g.APIPorts) != GroupMembers || g.PatroniScope != g.Name || g.PatroniNamespace != "/service/" {
		t.Fatalf("group node %+v", g)
	}
	if err := Exec(ctx, g.DSNWithPassword, "CREATE TABLE acked (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())"); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(g.DSNWithPassword)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["synchronous_commit"] = "on"
	before := g.Primary(t)

	// The writer: one insert at a time, the same id again after an error
	// (the insert is idempotent), the next one only once acknowledged.
	// For each acknowledged insert, when its (last) attempt was sent and
	// when it was acknowledged: an insert sent before the kill may be
	// read back after KillPrimary returned.
	type ack struct{ sent, acked time.Time }
	var (
		mu       sync.Mutex
		acked    []int64
		ackTimes []ack
		failures int
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		for id := int64(1); ; {
			select {
			case <-stop:
				return
			default:
			}
			if conn == nil {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				c, err := pgx.ConnectConfig(cctx, cfg)
				cancel()
				if err != nil {
					mu.Lock()
					failures++
					mu.Unlock()
					time.Sleep(20 * time.Millisecond)
					continue
				}
				conn = c
			}
			sent := time.Now()
			ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := conn.Exec(ectx, "INSERT INTO acked (id) VALUES ($1) ON CONFLICT (id) DO NOTHING", id)
			cancel()
			if err != nil {
				conn.Close(context.Background())
				conn = nil
				mu.Lock()
				failures++
				mu.Unlock()
				continue
			}
			mu.Lock()
			acked = append(acked, id)
			ackTimes = append(ackTimes, ack{sent, time.Now()})
			mu.Unlock()
			id++
		}
	}()
	stopWriter := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	}
	defer stopWriter()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	// firstAckSentAfter: when the first acknowledged insert sent after at
	// was acknowledged (zero if none yet).
	firstAckSentAfter := func(at time.Time) time.Time {
		mu.Lock()
		defer mu.Unlock()
		for i := len(ackTimes) - 1; i >= 0 && ackTimes[i].sent.After(at); i-- {
			if i == 0 || !ackTimes[i-1].sent.After(at) {
				return ackTimes[i].acked
			}
		}
		return time.Time{}
	}

	WaitFor(t, 30*time.Second, func() bool { return count() >= 200 }, "200 acknowledged inserts before the kill")
	var sc string
	c := g.Conn(t)
	if err := c.QueryRow(ctx, "SELECT current_setting('synchronous_standby_names')").Scan(&sc); err != nil || sc == "" {
		t.Fatalf("synchronous_standby_names on the primary: %q %v", sc, err)
	}
	c.Close(ctx)

	callStart := time.Now()
	victim := g.KillPrimary(t)
	killed := time.Now() // every process of the member is gone
	t.Logf("killed %s (primary before: %s; pg-kill took %v); %d inserts acknowledged before",
		victim, before, killed.Sub(callStart).Round(time.Millisecond), count())
	if victim != before {
		t.Fatalf("killed %s, but %s was the primary", victim, before)
	}
	var back time.Time
	WaitFor(t, 60*time.Second, func() bool { back = firstAckSentAfter(killed); return !back.IsZero() },
		"an acknowledged insert after killing the primary")
	after := g.Primary(t)
	mu.Lock()
	failed := failures
	mu.Unlock()
	t.Logf("kill -> first acknowledged insert: %v (new primary %s, %d failed attempts)",
		back.Sub(killed).Round(time.Millisecond), after, failed)
	if after == victim {
		t.Fatalf("%s is still the primary after it was killed", victim)
	}
	n := count()
	WaitFor(t, 30*time.Second, func() bool { return count() >= n+200 }, "200 more acknowledged inserts on the new primary")
	stopWriter()

	// Every acknowledged id is on the new primary.
	mu.Lock()
	ids := slices.Clone(acked)
	mu.Unlock()
	missing := func(dsn string) (int, int) {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var missing, rows int
		if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM unnest($1::bigint[]) AS a(id) WHERE NOT EXISTS (SELECT 1 FROM acked WHERE acked.id = a.id)), (SELECT count(*) FROM acked)`, ids).Scan(&missing, &rows); err != nil {
			t.Fatal(err)
		}
		return missing, rows
	}
	lost, rows := missing(g.DSNWithPassword)
	t.Logf("%d acknowledged inserts, %d lost; %d rows (%d committed without acknowledgement)", len(ids), lost, rows, rows-len(ids))
	if lost != 0 {
		t.Fatalf("%d of %d acknowledged inserts lost in the failover", lost, len(ids))
	}

	// The killed member rejoins as a standby.
	start := time.Now()
	g.StartMembers(t)
	t.Logf("%s rejoined and streams after %v", victim, time.Since(start).Round(time.Millisecond))
	if p := g.Primary(t); p != after {
		t.Fatalf("primary changed from %s to %s when %s rejoined", after, p, victim)
	}
	if s := g.Streaming(t); !slices.Contains(s, victim) {
		t.Fatalf("%s does not stream after rejoining (streaming: %v)", victim, s)
	}
	// It has every acknowledged insert (it is in recovery: read it directly).
	m := -1
	for i := range g.Members {
		if memberName(g.num, i+1) == victim {
			m = i
		}
	}
	if m < 0 {
		t.Fatalf("%s is not a member of %s", victim, g.Name)
	}
	host, port, _ := net.SplitHostPort(g.Members[m])
	direct := "postgres://postgres:" + g.Password + "@" + net.JoinHostPort(host, port) + "/" + g.Database + "?sslmode=disable"
	WaitFor(t, 30*time.Second, func() bool {
		conn, err := pgx.Connect(ctx, direct)
		if err != nil {
			return false
		}
		defer conn.Close(ctx)
		var inRecovery bool
		var have int
		if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery(), (SELECT count(*) FROM acked WHERE id = ANY($1))", ids).Scan(&inRecovery, &have); err != nil {
			return false
		}
		if !inRecovery {
			t.Fatalf("%s (port %s) is not in recovery after rejoining", victim, port)
		}
		return have == len(ids)
	}, victim+" replaying every acknowledged insert")
}
