package schema

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/internal/sqlstate"
	"github.com/shardvisor/shardvisor/topo"
)

// Each db node keeps its own record of the changes it has, in the table
// shardvisor.schema_changes, written in the same transaction as the
// change itself: a node's table is the truth about that node (a shardctl
// killed between a node's commit and its ZooKeeper write finds the row
// and does not run the change twice), and the ZooKeeper record is the
// cluster's view of it.

const historyDDL = `CREATE SCHEMA IF NOT EXISTS shardvisor;
CREATE TABLE IF NOT EXISTS shardvisor.schema_changes (
	id text PRIMARY KEY,
	seq integer NOT NULL,
	sha256 text NOT NULL,
	statements_done integer NOT NULL DEFAULT 0,
	done boolean NOT NULL DEFAULT false,
	applied_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	applied_by text NOT NULL DEFAULT ''
);
REVOKE ALL ON shardvisor.schema_changes FROM PUBLIC;
GRANT SELECT ON shardvisor.schema_changes TO PUBLIC`

// nodeRow is a node's row of one change.
type nodeRow struct {
	SHA256         string
	StatementsDone int
	Done           bool
}

// historyExists reports whether the node has shardvisor.schema_changes.
func historyExists(ctx context.Context, c *pgx.Conn) (bool, error) {
	var ok bool
	err := c.QueryRow(ctx, `SELECT pg_catalog.to_regclass('shardvisor.schema_changes') IS NOT NULL`).Scan(&ok)
	return ok, err
}

func ensureHistory(ctx context.Context, c *pgx.Conn) error {
	// Skip the DDL (and its locks) when the table is there.
	if ok, err := historyExists(ctx, c); ok || err != nil {
		return err
	}
	_, err := c.Exec(ctx, historyDDL)
	return err
}

// readRows reads a node's rows, by change id.
func readRows(ctx context.Context, c *pgx.Conn) (map[string]nodeRow, error) {
	rows, err := c.Query(ctx, `SELECT id, sha256, statements_done, done FROM shardvisor.schema_changes`)
	if err != nil {
		return nil, err
	}
	out := map[string]nodeRow{}
	for rows.Next() {
		var id string
		var r nodeRow
		if err := rows.Scan(&id, &r.SHA256, &r.StatementsDone, &r.Done); err != nil {
			return nil, err
		}
		out[id] = r
	}
	return out, rows.Err()
}

const upsertRow = `INSERT INTO shardvisor.schema_changes (id, seq, sha256, statements_done, done, applied_by)
	VALUES ($1, $2, $3, $4, $5, $6)
	ON CONFLICT (id) DO UPDATE SET statements_done = EXCLUDED.statements_done, done = EXCLUDED.done,
		applied_at = pg_catalog.now(), applied_by = EXCLUDED.applied_by`

// ErrStatement is a change's SQL refused by a node: not a lock timeout, a
// lost connection or anything else that trying again could cure.
var ErrStatement = errors.New("the change's SQL failed")

// stmtError is ErrStatement with the line of the change the node
// pointed at.
type stmtError struct {
	node, change string
	line         int
	err          error
}

func (e *stmtError) Error() string {
	where := ""
	if e.line > 0 {
		where = fmt.Sprintf(" at line %d", e.line)
	}
	return fmt.Sprintf("change %s failed on node %s%s: %v", e.change, e.node, where, e.err)
}
func (e *stmtError) Unwrap() []error { return []error{ErrStatement, e.err} }

// lineOf returns the line of text at PostgreSQL's error position (a
// 1-based character offset), 0 if unknown.
func lineOf(text string, err error, offset int) int {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Position <= 0 {
		return 0
	}
	pos := int(pe.Position) - 1
	line := offset
	for i := 0; i < len(text) && pos > 0; pos-- {
		if text[i] == '\n' {
			line++
		}
		_, n := utf8.DecodeRuneInString(text[i:])
		i += n
	}
	return line + 1
}

// retryable reports whether a failed attempt may be tried again: a lock
// that was not granted within lock_timeout, a deadlock, a serialization
// failure.
func retryable(err error) bool {
	switch sqlstate.Of(err) {
	case "55P03", "40P01", "40001":
		return true
	}
	return false
}

// attempt is what one node's run of one change measured.
type attempt struct {
	Attempts, LockTimeouts int
	BlockedMax             time.Duration
	// AppWait is the longest an application statement was seen waiting
	// behind the change (sampled from a second connection).
	AppWait time.Duration
	// BlockerWait is the time spent waiting, between attempts, for the
	// transactions that held the locks the change timed out on.
	BlockerWait    time.Duration
	StatementsDone int
}

func (a *attempt) took(d time.Duration) {
	a.Attempts++
	a.BlockedMax = max(a.BlockedMax, d)
}

// runChange applies change c on node (conn c), once: a transaction (or,
// in ModeStatements, each statement from where the node left off) with
// lock_timeout, retried after a lock timeout up to opt.Retries times. The
// node's history row is written with it.
func runChange(ctx context.Context, conn, watcher *pgx.Conn, node string, ch *topo.SchemaChange, row nodeRow, opt *Options) (attempt, error) {
	var a attempt
	if ch.Mode == topo.ModeStatements {
		return runStatements(ctx, conn, watcher, node, ch, row, opt)
	}
	b := backoff.New(50*time.Millisecond, time.Second)
	for {
		mon := watch(ctx, watcher, conn.PgConn().PID())
		start := time.Now()
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", opt.LockTimeout.Milliseconds())); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, ch.SQL); err != nil {
				return err
			}
			// The change may have set search_path (pg_dump's text does):
			// every name here is qualified.
			_, err := tx.Exec(ctx, upsertRow, ch.ID, ch.Seq, ch.SHA256, ch.Statements, true, opt.By)
			return err
		})
		a.took(time.Since(start))
		wait, blockers := mon.end()
		a.AppWait = max(a.AppWait, wait)
		if err == nil {
			a.StatementsDone = ch.Statements
			return a, nil
		}
		if retryable(err) && a.LockTimeouts < opt.Retries {
			a.LockTimeouts++
			if werr := giveWay(ctx, watcher, node, ch.ID, fmt.Sprintf("attempt %d", a.Attempts), blockers, b, &a, opt); werr != nil {
				return a, werr
			}
			continue
		}
		if retryable(err) {
			return a, fmt.Errorf("change %s on node %s: a lock was not granted within %s in %d attempts (the application holds long transactions on its tables?): %w", ch.ID, node, opt.LockTimeout, a.Attempts, err)
		}
		if isStatementError(err) {
			return a, &stmtError{node: node, change: ch.ID, line: lineOf(ch.SQL, err, 0), err: err}
		}
		return a, err
	}
}

// isStatementError reports whether err is PostgreSQL refusing the SQL
// (as opposed to a lost connection or a cancelled context).
func isStatementError(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	// Class 08 is a connection problem, 57 an operator intervention
	// (shutdown, cancel): both may go away; and so may a lock timeout or
	// a deadlock whose retries ran out.
	return !strings.HasPrefix(pe.Code, "08") && !strings.HasPrefix(pe.Code, "57") && !retryable(err)
}

// runStatements runs a change of ModeStatements from the statement the
// node's row says comes next, each statement on its own and its progress
// recorded after it. A CREATE INDEX CONCURRENTLY whose index is there and
// valid counts as done; an invalid one (a build that failed or was
// killed) is dropped concurrently and built again.
func runStatements(ctx context.Context, conn, watcher *pgx.Conn, node string, ch *topo.SchemaChange, row nodeRow, opt *Options) (attempt, error) {
	var a attempt
	stmts, err := Split(ch.SQL)
	if err != nil {
		return a, err
	}
	done := min(row.StatementsDone, len(stmts))
	a.StatementsDone = done
	b := backoff.New(50*time.Millisecond, time.Second)
	for i := done; i < len(stmts); {
		st := stmts[i]
		record := func(q interface {
			Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
		}) error {
			_, err := q.Exec(ctx, upsertRow, ch.ID, ch.Seq, ch.SHA256, i+1, i+1 == len(stmts), opt.By)
			return err
		}
		start := time.Now()
		var wait time.Duration
		var blockers []blocker
		if _, bare := outsideTransaction(st.SQL); bare {
			// Outside a transaction, as PostgreSQL wants; its progress is
			// written after it, so it must be safe to run twice: a
			// CREATE INDEX CONCURRENTLY whose valid index is there is
			// skipped, an invalid one dropped first. It waits for old
			// transactions, not for a lock writers queue behind: no
			// lock_timeout, and no watching.
			var skip bool
			if skip, err = prepareConcurrentIndex(ctx, conn, st.SQL); err == nil && !skip {
				if _, err = conn.Exec(ctx, "SET lock_timeout = 0"); err == nil {
					_, err = conn.Exec(ctx, st.SQL)
				}
			}
			a.took(time.Since(start))
			if err == nil {
				err = record(conn)
			}
		} else {
			// Every other statement runs in a transaction with its
			// progress, so a crash never leaves it done and unrecorded.
			mon := watch(ctx, watcher, conn.PgConn().PID())
			err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", opt.LockTimeout.Milliseconds())); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, st.SQL); err != nil {
					return err
				}
				return record(tx)
			})
			a.took(time.Since(start))
			wait, blockers = mon.end()
			a.AppWait = max(a.AppWait, wait)
		}
		if err != nil {
			if retryable(err) && a.LockTimeouts < opt.Retries {
				a.LockTimeouts++
				if werr := giveWay(ctx, watcher, node, ch.ID, fmt.Sprintf("statement at line %d", st.Line), blockers, b, &a, opt); werr != nil {
					return a, werr
				}
				continue
			}
			if isStatementError(err) {
				return a, &stmtError{node: node, change: ch.ID, line: lineOf(st.SQL, err, st.Line-1), err: err}
			}
			return a, err
		}
		i++
		a.StatementsDone = i
	}
	_, err = conn.Exec(ctx, "RESET lock_timeout")
	return a, err
}

// prepareConcurrentIndex looks at a CREATE INDEX CONCURRENTLY before it
// runs, finding its index by name in its table's schema (where
// PostgreSQL puts it, whatever the search_path): skip when it exists and
// is valid (the statement ran, its progress was not recorded); drop an
// invalid one (a build that failed or was killed), unless a build of it
// is running, which is an error naming the backend.
func prepareConcurrentIndex(ctx context.Context, conn *pgx.Conn, stmt string) (skip bool, err error) {
	name, table := concurrentIndex(stmt)
	if name == "" {
		return false, nil
	}
	var valid bool
	var nsp string
	var oid uint32
	err = conn.QueryRow(ctx, `SELECT i.indisvalid, n.nspname, c.oid FROM pg_catalog.pg_index i
		JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE i.indrelid = pg_catalog.to_regclass($1) AND c.relname = $2`, table, name).Scan(&valid, &nsp, &oid)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if valid {
		return true, nil
	}
	var builder *int32
	if err := conn.QueryRow(ctx, `SELECT max(pid) FROM pg_catalog.pg_stat_progress_create_index WHERE index_relid = $1`, oid).Scan(&builder); err != nil {
		return false, err
	}
	if builder != nil {
		return false, fmt.Errorf("index %s.%s is being built by backend %d (an earlier run?); wait for it, or cancel it with SELECT pg_cancel_backend(%d), then apply again", nsp, name, *builder, *builder)
	}
	if _, err = conn.Exec(ctx, "SET lock_timeout = 0"); err != nil {
		return false, err
	}
	_, err = conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+pgx.Identifier{nsp, name}.Sanitize())
	return false, err
}

// giveWay is what the change does after an attempt gave way (a lock not
// granted within lock_timeout, or a deadlock): wait, queueing nothing,
// for the transactions that held the locks to end (up to
// opt.BlockerWait), or, when none is known, back off.
func giveWay(ctx context.Context, watcher *pgx.Conn, node, change, what string, blockers []blocker, b *backoff.Backoff, a *attempt, opt *Options) error {
	if watcher == nil || len(blockers) == 0 {
		opt.event(Event{Node: node, Change: change, Message: fmt.Sprintf("%s gave way (lock not granted within %s, or a deadlock): retrying", what, opt.LockTimeout)})
		return b.Wait(ctx)
	}
	opt.event(Event{Node: node, Change: change, Message: fmt.Sprintf("%s gave way after %s: waiting for the transactions that held the lock to end: %s", what, opt.LockTimeout, describeBlockers(blockers))})
	waited, open, err := awaitBlockers(ctx, watcher, blockers, opt.BlockerWait)
	a.BlockerWait += waited
	if err != nil {
		return err
	}
	if len(open) > 0 {
		opt.event(Event{Node: node, Change: change, Message: fmt.Sprintf("still open after %s: %s; trying again", waited.Round(time.Millisecond), describeBlockers(open))})
		return b.Wait(ctx)
	}
	return nil
}
