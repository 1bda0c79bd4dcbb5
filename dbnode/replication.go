package dbnode

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// The replication catalog reads that a move's streams are judged by (the
// mover, its probes, and a schema change running beside them).

// SubscriptionEnabled reads whether subscription name of the connection's
// database is enabled; nil when there is no such subscription.
func SubscriptionEnabled(ctx context.Context, c *pgx.Conn, name string) (*bool, error) {
	var enabled *bool
	err := c.QueryRow(ctx, `SELECT (SELECT subenabled FROM pg_subscription WHERE subname = $1
		AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database()))`, name).Scan(&enabled)
	return enabled, err
}

// Slot is a replication slot as its server has it.
type Slot struct {
	// WALStatus is the slot's wal_status (reserved, extended,
	// unreserved: about to be invalidated, lost; "" unknown).
	WALStatus string
	// LagBytes is the server's WAL written since the slot's confirmed
	// position (nil: not known).
	LagBytes *int64
}

// ReplicationSlot reads slot name; nil when there is none.
func ReplicationSlot(ctx context.Context, c *pgx.Conn, name string) (*Slot, error) {
	var s Slot
	err := c.QueryRow(ctx, `SELECT coalesce(wal_status, ''), pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&s.WALStatus, &s.LagBytes)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &s, nil
}
