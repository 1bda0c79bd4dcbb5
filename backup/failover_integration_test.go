package backup_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardvisor/shardvisor/backup"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// TestFaultsArchiveAcrossFailover: a Patroni group's primary host is
// killed under a write load; the new primary archives on its timeline into
// the same stanza. A point-in-time recovery to a time after the failover
// has every write acknowledged before that time, those acknowledged by
// the new primary among them.
func TestFaultsArchiveAcrossFailover(t *testing.T) {
	testenv.Faults(t)
	testenv.Exclusive(t)
	pg := testenv.StartPGGroups(t, 1)
	g := pg.Nodes[0]
	cmd, cfg := testenv.PGBackRest(t)
	pgbr := backup.PGBackRest{Command: cmd, Config: cfg}
	stanza := testenv.Stanza(g)
	ctx := context.Background()
	if err := testenv.Exec(ctx, g.DSNWithPassword, `CREATE TABLE acked (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	if _, err := pgbr.Backup(ctx, stanza, backup.Incr); err != nil {
		t.Fatal(err)
	}
	type ack struct {
		id int64
		at time.Time // when the client had the commit's answer
	}
	var mu sync.Mutex
	var acks []ack
	var lastErr error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var c *pgx.Conn
		defer func() {
			if c != nil {
				c.Close(ctx)
			}
		}()
		for id := int64(1); ; {
			select {
			case <-stop:
				return
			default:
			}
			if c == nil {
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				var err error
				c, err = pgx.Connect(cctx, g.DSNWithPassword)
				cancel()
				if err != nil {
					mu.Lock()
					lastErr = err
					mu.Unlock()
					c = nil
					time.Sleep(100 * time.Millisecond)
					continue
				}
			}
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := c.Exec(wctx, `INSERT INTO acked (id) VALUES ($1)`, id)
			cancel()
			if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "23505" {
				// The try whose answer the kill lost had committed (and
				// reached the synchronous standby): the id is taken, not
				// acknowledged to us. Go on with the next one.
				id++
				continue
			}
			if err != nil {
				mu.Lock()
				lastErr = err
				mu.Unlock()
				c.Close(ctx)
				c = nil
				continue
			}
			mu.Lock()
			acks = append(acks, ack{id, time.Now()})
			mu.Unlock()
			id++
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	time.Sleep(2 * time.Second)
	killed := g.KillPrimary(t)
	killedAt := time.Now()
	newPrimary := g.Primary(t)
	// Writes on the new primary for a while, then the target time, then more.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		mu.Lock()
		n, last, lerr := len(acks), time.Time{}, lastErr
		if n > 0 {
			last = acks[n-1].at
		}
		mu.Unlock()
		if last.After(killedAt.Add(3 * time.Second)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write acknowledged 3 s after the kill within a minute: %d acknowledged, the last at %s; last error: %v", n, last.Format(time.StampMilli), lerr)
		}
	}
	time.Sleep(time.Second)
	target := time.Now()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	// The segment holding the target is archived now (check switches WAL
	// and waits for it).
	if err := pgbr.Check(ctx, stanza); err != nil {
		t.Fatal(err)
	}
	sc, err := pgbr.RecoverScratch(ctx, scratchDir(t), "", g.Name, stanza, g.Database, backup.Target{Time: target})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	c, err := sc.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT id FROM acked`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	have := map[int64]bool{}
	for _, id := range ids {
		have[id] = true
	}
	var before, missing, afterKill int
	for _, a := range acks {
		if !a.at.Before(target) {
			continue
		}
		before++
		if a.at.After(killedAt) {
			afterKill++
		}
		if !have[a.id] {
			missing++
		}
	}
	var timeline int
	_ = c.QueryRow(ctx, `SELECT timeline_id FROM pg_control_checkpoint()`).Scan(&timeline)
	t.Logf("killed %s, new primary %s; recovered to %s in %s (timeline %d): %d rows; %d writes acknowledged before the target (%d after the kill), %d missing",
		killed, newPrimary, target.Format(time.StampMilli), sc.Recovered.Round(time.Millisecond), timeline, len(ids), before, afterKill, missing)
	if afterKill == 0 {
		t.Fatal("no write was acknowledged by the new primary before the target")
	}
	if missing > 0 {
		t.Fatalf("%d of %d writes acknowledged before the target are missing from the recovery", missing, before)
	}
}
