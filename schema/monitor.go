package schema

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// A change's attempt is watched from a second connection to the node: how
// long the application's statements have been waiting behind the
// change's locks (the wait the issue asks to report, seen from the node,
// not guessed from the change's side), and which transactions held the
// locks the change waited for. After a lock timeout the change waits for
// those transactions to end before it queues again, instead of queueing
// the application's writes behind itself once per retry.

// monitorEvery is how often an attempt is sampled: the waits it reports
// are lower bounds within this resolution.
const monitorEvery = 25 * time.Millisecond

// blocker is a transaction that held a lock the change waited for: its
// backend and when its transaction began (a pid is reused, a transaction
// start is not).
type blocker struct {
	PID   int32
	Start time.Time
}

type monitor struct {
	conn    *pgx.Conn
	pid     uint32 // the change's backend
	stop    chan struct{}
	done    chan struct{}
	wait    time.Duration
	blocked []blocker
	err     error
}

// sampleSQL reads the lock table once: the longest wait (in seconds) of
// a backend queued for a relation the change ($1) holds or asks for, and
// whether the change itself is waiting. pg_blocking_pids, which takes the
// lock manager's state exclusively, is called only then, and only for
// the change (blockersSQL).
const sampleSQL = `WITH l AS MATERIALIZED (
		SELECT pid, relation, granted FROM pg_catalog.pg_locks
		WHERE locktype = 'relation' AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())),
	waiters AS (SELECT DISTINCT pid FROM l WHERE NOT granted AND pid <> $1::int4 AND relation IN (SELECT relation FROM l WHERE pid = $1::int4))
	SELECT (SELECT coalesce(max(extract(epoch FROM pg_catalog.clock_timestamp() - a.query_start)), 0)::float8
			FROM pg_catalog.pg_stat_activity a WHERE a.pid IN (SELECT pid FROM waiters)),
		EXISTS (SELECT FROM l WHERE pid = $1::int4 AND NOT granted)`

const blockersSQL = `SELECT coalesce(pg_catalog.array_agg(a.pid), '{}'), coalesce(pg_catalog.array_agg(a.xact_start), '{}')
	FROM pg_catalog.pg_stat_activity a WHERE a.pid = ANY (pg_catalog.pg_blocking_pids($1::int4)) AND a.xact_start IS NOT NULL`

// watch starts sampling the backend pid through conn (nil: a monitor
// that measures nothing).
func watch(ctx context.Context, conn *pgx.Conn, pid uint32) *monitor {
	m := &monitor{conn: conn, pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	if conn == nil {
		close(m.done)
		return m
	}
	go func() {
		defer close(m.done)
		t := time.NewTicker(monitorEvery)
		defer t.Stop()
		for {
			m.sample(ctx)
			select {
			case <-m.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return m
}

func (m *monitor) sample(ctx context.Context) {
	if m.err != nil {
		return
	}
	var secs float64
	var waiting bool
	if err := m.conn.QueryRow(ctx, sampleSQL, int32(m.pid)).Scan(&secs, &waiting); err != nil {
		m.err = err
		return
	}
	m.wait = max(m.wait, time.Duration(secs*float64(time.Second)))
	if !waiting {
		return
	}
	var pids []int32
	var starts []time.Time
	if err := m.conn.QueryRow(ctx, blockersSQL, int32(m.pid)).Scan(&pids, &starts); err != nil {
		m.err = err
		return
	}
	for i, p := range pids {
		b := blocker{PID: p, Start: starts[i]}
		if !slices.Contains(m.blocked, b) {
			m.blocked = append(m.blocked, b)
		}
	}
}

// end stops the sampling and returns the longest wait seen and the
// transactions that blocked the change.
func (m *monitor) end() (time.Duration, []blocker) {
	select {
	case <-m.done:
	default:
		close(m.stop)
		<-m.done
	}
	return m.wait, m.blocked
}

// awaitBlockers waits, up to bound, until none of the transactions that
// blocked the change is still open. It queues nothing meanwhile, so the
// application's writes flow. It returns how long it waited and the ones
// still open at the bound.
func awaitBlockers(ctx context.Context, conn *pgx.Conn, bs []blocker, bound time.Duration) (time.Duration, []blocker, error) {
	start := time.Now()
	for {
		var open []blocker
		for _, b := range bs {
			var still bool
			if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity WHERE pid = $1 AND xact_start = $2)`, b.PID, b.Start).Scan(&still); err != nil {
				return time.Since(start), nil, err
			}
			if still {
				open = append(open, b)
			}
		}
		if len(open) == 0 || time.Since(start) >= bound {
			return time.Since(start), open, nil
		}
		select {
		case <-ctx.Done():
			return time.Since(start), open, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func describeBlockers(bs []blocker) string {
	parts := make([]string, 0, len(bs))
	for _, b := range bs {
		parts = append(parts, fmt.Sprintf("pid %d (open %s)", b.PID, time.Since(b.Start).Round(time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}
