// Package sqlstate classifies PostgreSQL errors by their SQLSTATE, for the
// few codes shardvisor raises itself. It is a leaf, so that the router can
// tell a fence rejection without importing package fence.
package sqlstate

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// FenceRejected is the SQLSTATE of a write the fence rejects (fence.SQLState).
const FenceRejected = "SV001"

// Of returns err's SQLSTATE, or "" if err is not a PostgreSQL error.
func Of(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// IsFenceRejected reports whether err is a write the fence rejected.
func IsFenceRejected(err error) bool { return Of(err) == FenceRejected }

// ReadOnlyTransaction is PostgreSQL's read_only_sql_transaction: a write
// sent to a standby. Through a pooler it is how a failover shows: the
// client's connection to a member's pooler outlives the member's
// demotion, and the pooler's next server connection reaches a standby.
const ReadOnlyTransaction = "25006"

// IsReadOnly reports whether err is a write a standby refused.
func IsReadOnly(err error) bool { return Of(err) == ReadOnlyTransaction }
