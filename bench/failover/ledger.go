package main

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/router"
)

// ledger is every write's fate.
type ledger struct {
	mu         sync.Mutex
	acked      []int64
	failed     atomic.Int64
	duplicates atomic.Int64
	lat        []sample
	errs       map[string]int64 // failed attempts by errClass
}

// errClass names a failed attempt's error for the report: its SQLSTATE
// and message, or the error's text cut short (the ways a failover shows
// differ between the direct path and a pooler's).
func errClass(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return "SQLSTATE " + pe.Code + ": " + pe.Message
	}
	s := err.Error()
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}

type sample struct {
	at  time.Time // when the write was acknowledged
	dur time.Duration
}

// write inserts one row with id through router.Do. An error after the
// statement was sent leaves the outcome unknown: the same id is retried
// (ON CONFLICT DO NOTHING), and a retry that finds it committed counts a
// duplicate.
func (led *ledger) write(ctx context.Context, r *router.Router, ks *keystream.Keystream, id int64) {
	uid := "u" + strconv.FormatInt(id%100000, 10)
	key := keystream.Key(ks.Prefix64(uid))
	unknown := false
	for range 100 {
		start := time.Now()
		var inserted int64
		err := r.Do(ctx, uid, func(ctx context.Context, pool *pgxpool.Pool, _ router.Route) error {
			tag, err := pool.Exec(ctx, `INSERT INTO bench_failover (bkey, id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, key, id)
			inserted = tag.RowsAffected()
			return err
		})
		if err == nil {
			now := time.Now()
			led.mu.Lock()
			led.acked, led.lat = append(led.acked, id), append(led.lat, sample{at: now, dur: now.Sub(start)})
			led.mu.Unlock()
			if unknown && inserted == 0 {
				led.duplicates.Add(1)
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		led.failed.Add(1)
		led.mu.Lock()
		if led.errs == nil {
			led.errs = map[string]int64{}
		}
		led.errs[errClass(err)]++
		led.mu.Unlock()
		if errors.Is(err, router.ErrNoPrimary) || router.Retryable(err) {
			// Never sent: nothing committed. Try the same id again (the
			// app would).
			continue
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return
		}
		// Sent, then the connection died: unknown outcome.
		unknown = true
		time.Sleep(10 * time.Millisecond)
	}
}

func (led *ledger) ackedCount() int64 {
	led.mu.Lock()
	defer led.mu.Unlock()
	return int64(len(led.acked))
}

// firstAckAfter waits for the earliest acknowledgement after the kill by
// a write that started after the kill (earlier ones may have been
// acknowledged by the dying primary just before); zero after within.
func (led *ledger) firstAckAfter(kill time.Time, within time.Duration) time.Time {
	for deadline := kill.Add(within); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var first time.Time
		led.mu.Lock()
		for i := len(led.lat) - 1; i >= 0 && led.lat[i].at.After(kill); i-- {
			if s := led.lat[i]; s.at.Add(-s.dur).After(kill) && (first.IsZero() || s.at.Before(first)) {
				first = s.at
			}
		}
		led.mu.Unlock()
		if !first.IsZero() {
			return first
		}
	}
	return time.Time{}
}

// windows splits the latencies: before the kill (steady), during (kill
// to the first write + 1 s) and after (the steady period after that).
func (led *ledger) windows(kill, first time.Time) (b, d, a []time.Duration) {
	led.mu.Lock()
	defer led.mu.Unlock()
	duringEnd := first.Add(time.Second)
	for _, s := range led.lat {
		switch {
		case s.at.After(kill.Add(-*steady)) && !s.at.After(kill):
			b = append(b, s.dur)
		case s.at.After(kill) && !s.at.After(duringEnd):
			d = append(d, s.dur)
		case s.at.After(duringEnd) && !s.at.After(duringEnd.Add(*steady)):
			a = append(a, s.dur)
		}
	}
	return b, d, a
}

// lost counts the acknowledged ids missing on the group's current primary.
func (led *ledger) lost(ctx context.Context, r *router.Router) (n int64, err error) {
	pool, err := r.NodePool(ctx, "g1")
	if err != nil {
		return 0, err
	}
	err = pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::bigint[]) AS a(id) WHERE NOT EXISTS (SELECT FROM bench_failover b WHERE b.id = a.id)`, led.acked).Scan(&n)
	return n, err
}
