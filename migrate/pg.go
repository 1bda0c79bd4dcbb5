package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/topo"
)

// The marker table carries the move's barrier and lag probes through the
// same replication stream as the rows: logical replication applies in
// commit order, so a marker seen on the target proves that everything
// committed on the source before it has been applied too.
const markerDDL = `CREATE SCHEMA IF NOT EXISTS shardvisor;
CREATE TABLE IF NOT EXISTS shardvisor.move_marker (
	move_id text NOT NULL,
	seq     bigint NOT NULL,
	at      timestamptz NOT NULL DEFAULT clock_timestamp(),
	PRIMARY KEY (move_id, seq)
);
DO $d$
BEGIN
	-- Made, or mended (disabled, or not ALWAYS), once per node: the
	-- trigger's creation locks the table, which every freeze writes.
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid = 'shardvisor.move_marker'::regclass
			AND tgname = 'move_marker_notify' AND tgenabled = 'A') THEN
		-- Two moves preparing on one node at once would otherwise race
		-- to create the function.
		PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('shardvisor.move_marker_notify'));
		CREATE OR REPLACE FUNCTION shardvisor.move_marker_notify() RETURNS trigger
		LANGUAGE plpgsql SET search_path = pg_catalog AS $f$
		BEGIN
			-- Only where replication applies the marker (the apply
			-- worker runs as replica): the source's own insert wakes
			-- no one. Never with the server's notification queue
			-- half full (other applications' listeners behind): a
			-- full queue fails the NOTIFY's commit, which would be
			-- the apply worker's, and disable the subscription. The
			-- waiter's poll finds the marker then.
			IF current_setting('session_replication_role') = 'replica' AND pg_notification_queue_usage() < 0.5 THEN
				PERFORM pg_notify('` + markerChannel + `', NEW.move_id || ':' || NEW.seq);
			END IF;
			RETURN NULL;
		END $f$;
		CREATE OR REPLACE TRIGGER move_marker_notify AFTER INSERT ON shardvisor.move_marker
			FOR EACH ROW EXECUTE FUNCTION shardvisor.move_marker_notify();
		-- Apply workers fire only ALWAYS (or REPLICA) triggers.
		ALTER TABLE shardvisor.move_marker ENABLE ALWAYS TRIGGER move_marker_notify;
	END IF;
END $d$`

// markerChannel is what the marker table's trigger notifies, with the
// payload "move:seq", when replication applies a marker: waitMarker
// listens on it instead of polling, so the barrier inside the pause costs
// one query after the marker lands rather than a round trip every
// millisecond meanwhile, each one CPU the apply worker and (over TLS) the
// encryption compete for.
const markerChannel = "shardvisor_move_marker"

func ident(name string) string { return pgx.Identifier(strings.Split(name, ".")).Sanitize() }

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// ensureMarker creates the marker table on a node.
func ensureMarker(ctx context.Context, c *pgx.Conn) error {
	// Bounded like a fence change: the trigger's first creation waits
	// for the table's lock, and marker inserts (another move's freeze)
	// would queue behind that wait. One implicit transaction: SET LOCAL
	// holds for the rest.
	_, err := c.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = '%dms';\n", fence.LockTimeout.Milliseconds())+markerDDL)
	return err
}

// clearRange deletes the range's rows from every table, bypassing the
// fence (session_replication_role = replica), in one transaction.
func clearRange(ctx context.Context, c *pgx.Conn, tables []topo.TableRecord, lo, hi int64) (int64, error) {
	tx, err := c.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
		return 0, err
	}
	var n int64
	for _, t := range tables {
		tag, err := tx.Exec(ctx, fmt.Sprintf("DELETE FROM %s WHERE %s BETWEEN $1 AND $2", ident(t.Name), ident(t.KeyColumn)), lo, hi)
		if err != nil {
			return 0, fmt.Errorf("clearing %s: %w", t.Name, err)
		}
		n += tag.RowsAffected()
	}
	return n, tx.Commit(ctx)
}

// createPublication publishes the range of every table, and the move's
// markers, from the source. publish excludes truncate, so a TRUNCATE on
// the source cannot wipe the target. publish_via_partition_root makes a
// partitioned sharded table publish its partitions' changes as the
// parent's, under the parent's row filter (PostgreSQL refuses a row
// filter on a partitioned table otherwise), so the copy and the stream go
// through the target's parent and land in whichever of its partitions
// holds the key; it changes nothing for plain tables.
func createPublication(ctx context.Context, c *pgx.Conn, name, moveID string, tables []topo.TableRecord, lo, hi int64) error {
	if exists, err := publicationExists(ctx, c, name); err != nil || exists {
		return err
	}
	var parts []string
	for _, t := range tables {
		parts = append(parts, fmt.Sprintf("TABLE %s WHERE (%s BETWEEN %d AND %d)", ident(t.Name), ident(t.KeyColumn), lo, hi))
	}
	parts = append(parts, fmt.Sprintf("TABLE shardvisor.move_marker WHERE (move_id = %s)", literal(moveID)))
	_, err := c.Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR %s WITH (publish = 'insert, update, delete', publish_via_partition_root = true)", ident(name), strings.Join(parts, ", ")))
	return err
}

// createSubscription subscribes the target to the publication, disabled
// and without copying: the mover copies the range itself (copy.go) from
// the snapshot exported with the slot, which it creates itself on the
// source, and enables the subscription once that copy is committed, so
// that the apply worker replays every change made after the snapshot.
// The subscription is created before the slot so that it owns it from the
// start: whoever drops it (an abort, a resume, teardown) drops the slot
// with it. It cannot run in a transaction, and pgx sends a statement
// without arguments in the simple protocol.
func createSubscription(ctx context.Context, c *pgx.Conn, name, slot, publication, conninfo string, extra ...string) error {
	if exists, err := subscriptionExists(ctx, c, name); err != nil || exists {
		return err
	}
	_, err := c.Exec(ctx, fmt.Sprintf(`CREATE SUBSCRIPTION %s CONNECTION %s PUBLICATION %s
		WITH (enabled = false, copy_data = false, create_slot = false, slot_name = %s, binary = true, disable_on_error = true%s)`,
		ident(name), literal(conninfo), ident(publication), literal(slot), strings.Join(extra, "")))
	if err != nil {
		// The error may quote the statement: never show the conninfo.
		return errors.New(strings.ReplaceAll(err.Error(), conninfo, "<conninfo>"))
	}
	return nil
}

// disableSubscription stops the subscription's apply worker, if there is
// such a subscription.
func disableSubscription(ctx context.Context, c *pgx.Conn, name string) error {
	if exists, err := subscriptionExists(ctx, c, name); err != nil || !exists {
		return err
	}
	_, err := c.Exec(ctx, fmt.Sprintf("ALTER SUBSCRIPTION %s DISABLE", ident(name)))
	return err
}

// enableSubscription starts the subscription's apply worker.
func enableSubscription(ctx context.Context, c *pgx.Conn, name string) error {
	_, err := c.Exec(ctx, fmt.Sprintf("ALTER SUBSCRIPTION %s ENABLE", ident(name)))
	return err
}

// subscriptionState reports whether the subscription is enabled and how
// many of its tables are not yet copied.
func subscriptionState(ctx context.Context, c *pgx.Conn, name string) (enabled bool, notReady int, err error) {
	err = c.QueryRow(ctx, `SELECT s.subenabled, count(*) FILTER (WHERE r.srsubstate IS DISTINCT FROM 'r')
		FROM pg_subscription s LEFT JOIN pg_subscription_rel r ON r.srsubid = s.oid
		WHERE s.subname = $1 GROUP BY s.subenabled`, name).Scan(&enabled, &notReady)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, 0, fmt.Errorf("subscription %s does not exist on the target", name)
	}
	return enabled, notReady, err
}

// insertMarker writes marker seq on the source and returns when. The
// commit waits for its WAL to be flushed locally whatever the server's
// synchronous_commit: logical replication only sends flushed WAL, so with
// synchronous_commit = off the marker (and the barrier) would otherwise
// wait for the WAL writer, up to wal_writer_delay.
func insertMarker(ctx context.Context, c *pgx.Conn, moveID string, seq int64) (time.Time, error) {
	tx, err := c.Begin(ctx)
	if err != nil {
		return time.Time{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = local"); err != nil {
		return time.Time{}, err
	}
	var at time.Time
	if err := tx.QueryRow(ctx, `INSERT INTO shardvisor.move_marker (move_id, seq) VALUES ($1, $2)
		ON CONFLICT (move_id, seq) DO UPDATE SET at = shardvisor.move_marker.at RETURNING at`, moveID, seq).Scan(&at); err != nil {
		return time.Time{}, err
	}
	return at, tx.Commit(ctx)
}

// markerStmt writes marker seq inside another transaction (the freeze).
func markerStmt(moveID string, seq int64) fence.Stmt {
	return fence.Stmt{SQL: `INSERT INTO shardvisor.move_marker (move_id, seq) VALUES ($1, $2) ON CONFLICT (move_id, seq) DO NOTHING`, Args: []any{moveID, seq}}
}

// waitMarker waits until marker seq has been applied on the target. It
// listens on markerChannel (the LISTEN and the first check in one round
// trip) and checks again on each notification; poll bounds the wait for
// one that never comes (a notification sent between the first check and
// the LISTEN's commit, a marker table whose trigger an older mover did
// not create), so a lost notification costs at most poll.
func waitMarker(ctx context.Context, c *pgx.Conn, moveID string, seq int64, poll time.Duration) error {
	listen := true
	for {
		var ok bool
		b := &pgx.Batch{}
		if listen {
			// Idempotent: the connection keeps listening for the rest
			// of the move; notifications that arrive meanwhile wait
			// in pgx's queue and cost one check each here.
			b.Queue("LISTEN " + markerChannel)
		}
		b.Queue("SELECT EXISTS (SELECT 1 FROM shardvisor.move_marker WHERE move_id = $1 AND seq = $2)", moveID, seq).QueryRow(func(row pgx.Row) error {
			return row.Scan(&ok)
		})
		if err := c.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		listen = false
		if ok {
			return nil
		}
		if err := waitMarkerNotice(ctx, c, moveID, poll); err != nil {
			return err
		}
	}
}

// waitMarkerNotice waits up to poll for a notification of one of the
// move's markers. Others (other moves into this database, stale ones)
// cost no query. A notification is only a hint to look again: anyone who
// can connect may NOTIFY on the channel, so the table says whether the
// marker is there.
func waitMarkerNotice(ctx context.Context, c *pgx.Conn, moveID string, poll time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, poll)
	defer cancel()
	for {
		n, err := c.WaitForNotification(wctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
				return nil // poll
			}
			return err
		}
		if n != nil && n.Channel == markerChannel && strings.HasPrefix(n.Payload, moveID+":") {
			return nil
		}
	}
}

// dropSubscription removes the subscription and, through it, its slot on
// the source. When the source cannot be reached the slot is detached first
// so that the drop does not need it; the caller then owes the source a
// dropSlot.
func dropSubscription(ctx context.Context, c *pgx.Conn, name string, sourceReachable bool) error {
	if exists, err := subscriptionExists(ctx, c, name); err != nil || !exists {
		return err
	}
	if !sourceReachable {
		for _, q := range []string{"ALTER SUBSCRIPTION %s DISABLE", "ALTER SUBSCRIPTION %s SET (slot_name = NONE)"} {
			if _, err := c.Exec(ctx, fmt.Sprintf(q, ident(name))); err != nil {
				return err
			}
		}
	}
	_, err := c.Exec(ctx, fmt.Sprintf("DROP SUBSCRIPTION %s", ident(name)))
	if err != nil && sourceReachable && slotGone(err) {
		// The source has no such slot (a new primary after a failover:
		// PostgreSQL 15's slots do not survive one), and DROP
		// SUBSCRIPTION insists on dropping it there: detach it.
		return dropSubscription(ctx, c, name, false)
	}
	return err
}

// slotGone: DROP SUBSCRIPTION failed because its slot is not on the
// publisher.
func slotGone(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "could not drop replication slot") && strings.Contains(msg, "does not exist")
}

// dropPublication removes the publication from the source.
func dropPublication(ctx context.Context, c *pgx.Conn, name string) error {
	_, err := c.Exec(ctx, fmt.Sprintf("DROP PUBLICATION IF EXISTS %s", ident(name)))
	return err
}

// dropSlot removes a replication slot left on the source, if it is there
// and not in use.
func dropSlot(ctx context.Context, c *pgx.Conn, slot string) error {
	_, err := c.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", slot)
	return err
}

// releaseSlot waits until no walsender holds the move's slot on the
// source (one whose client died and the server has not noticed yet, or
// the apply worker of a subscription just disabled), terminating its
// holder. Only for the move's own slot, once nothing may use it. It gives
// up after about 10 s.
func releaseSlot(ctx context.Context, c *pgx.Conn, slot string) error {
	for range 100 {
		var active bool
		if err := c.QueryRow(ctx, `SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active); err != nil || !active {
			return err
		}
		if _, err := c.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active", slot); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("replication slot %s stays in use", slot)
}

// dropSlotNow removes the move's slot from the source, releasing it first.
func dropSlotNow(ctx context.Context, c *pgx.Conn, slot string) error {
	if err := releaseSlot(ctx, c, slot); err != nil {
		return err
	}
	return dropSlot(ctx, c, slot)
}

// The catalog's existence checks for a move's replication objects: every
// caller asks through these, so that each question has one query.

// slotExists reports whether a replication slot exists on a node.
func slotExists(ctx context.Context, c *pgx.Conn, slot string) (bool, error) {
	return catalogHas(ctx, c, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", slot)
}

// publicationExists reports whether a publication exists in c's database.
func publicationExists(ctx context.Context, c *pgx.Conn, name string) (bool, error) {
	return catalogHas(ctx, c, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", name)
}

// subscriptionExists reports whether a subscription of that name exists on
// c's server.
func subscriptionExists(ctx context.Context, c *pgx.Conn, name string) (bool, error) {
	return catalogHas(ctx, c, "SELECT EXISTS (SELECT 1 FROM pg_subscription WHERE subname = $1)", name)
}

func catalogHas(ctx context.Context, c *pgx.Conn, query, name string) (bool, error) {
	var ok bool
	err := c.QueryRow(ctx, query, name).Scan(&ok)
	return ok, err
}

// clearMarkers deletes the move's markers on a node.
func clearMarkers(ctx context.Context, c *pgx.Conn, moveID string) error {
	_, err := c.Exec(ctx, "DELETE FROM shardvisor.move_marker WHERE move_id = $1", moveID)
	return err
}

// querier is what verification reads through: a connection or a
// transaction (Begin: its own transaction, or a savepoint).
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ReplicationObjects lists the moves' replication objects in the connected
// database ("slot sv_...", "publication sv_...", "subscription sv_..."):
// after every move has finished, there should be none.
func ReplicationObjects(ctx context.Context, c *pgx.Conn) ([]string, error) {
	like := strings.ReplaceAll(objectPrefix, "_", `\_`) + "%"
	var out []string
	for _, q := range []string{
		`SELECT 'slot ' || slot_name FROM pg_replication_slots WHERE slot_name LIKE $1 AND database = current_database()`,
		`SELECT 'publication ' || pubname FROM pg_publication WHERE pubname LIKE $1`,
		`SELECT 'subscription ' || subname FROM pg_subscription WHERE subname LIKE $1 AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())`,
	} {
		rows, err := c.Query(ctx, q, like)
		if err != nil {
			return out, err
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return out, err
		}
		out = append(out, names...)
	}
	return out, nil
}

// objectPrefix starts the name of every publication, subscription and slot
// a move creates.
const objectPrefix = "sv_"

// syncPoint commits a transaction with an xid under synchronous_commit=on:
// its commit waits until the synchronous standbys have the WAL up to it,
// so everything committed on c's server before is on them too. On a
// server without synchronous standbys it costs one local commit.
//
// One implicit transaction, in one round trip (it runs inside the write
// pause; BEGIN, SET LOCAL, the xid and COMMIT apart were four, each a wait
// for the scheduler on a loaded machine). set_config's local setting holds
// until that transaction's commit, which reads it.
func syncPoint(ctx context.Context, c *pgx.Conn) error {
	// The marker waits are over: stop listening, in the same round trip,
	// before this connection holds the verification snapshot's long
	// transaction, in which a listener would keep the server's whole
	// notification queue from being truncated.
	_, err := c.Exec(ctx, "UNLISTEN "+markerChannel+"; SELECT set_config('synchronous_commit', 'on', true), pg_current_xact_id()")
	return err
}
