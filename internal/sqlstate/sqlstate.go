// Package sqlstate classifies PostgreSQL errors by their SQLSTATE, for the
// few codes shardvisor raises itself. It is a leaf, so that the router can
// tell a fence rejection without importing package fence.
package sqlstate

import (
	"errors"
	"slices"
	"strings"

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

// PoolerError is the SQLSTATE PgBouncer gives the errors of its own
// (protocol_violation).
const PoolerError = "08P01"

// poolerNoServer are PgBouncer's messages for a client it could not give
// a server connection: every server busy for query_wait_timeout, or its
// server failing (a login to it failed, or the connection did, within
// server_login_retry: a failover's demoted or restarting member, a killed
// postmaster). Each is sent only to a client waiting for a server, never
// to one linked to a server (mid-transaction, at COMMIT, with a Sync
// outstanding): its query reached no server. "server login has been
// failing" also names a cached error from 1.24 on ("..., cached error:
// ... (server_login_retry)"); "pgbouncer cannot connect to server" is
// 1.16's and older.
var poolerNoServer = []string{
	"query_wait_timeout",
	"client_login_timeout (server down)",
	"pgbouncer cannot connect to server",
}

// poolerLoginFailing is the start of PgBouncer's server_login_retry error.
const poolerLoginFailing = "server login has been failing"

// IsPoolerNoServer reports whether err is PgBouncer refusing a query it
// found no server for: nothing reached PostgreSQL, so the work is safe to
// try again (PgBouncer closes that client connection). Its other errors,
// "server conn crashed?" above all, come after the query was sent. A
// server that refuses the pooler's login for good (a missing database,
// max_connections reached) shows the same way, so a retry of it ends
// only at the retrier's bound, with this message as the last error.
func IsPoolerNoServer(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != PoolerError {
		return false
	}
	if strings.HasPrefix(pe.Message, poolerLoginFailing) && strings.HasSuffix(pe.Message, "(server_login_retry)") {
		return true
	}
	return slices.Contains(poolerNoServer, pe.Message)
}
