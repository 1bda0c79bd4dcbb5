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

// PoolerError is the SQLSTATE PgBouncer gives the errors of its own
// (protocol_violation).
const PoolerError = "08P01"

// poolerNoServer are PgBouncer's messages (1.18 and later) for a client
// it could not give a server connection: its server down (the login
// failing, a failover's demoted or restarting member), or every server
// busy for query_wait_timeout. The client's query waited in PgBouncer and
// reached no server.
var poolerNoServer = []string{
	"server login has been failing, try again later (server_login_retry)",
	"query_wait_timeout",
	"client_login_timeout (server down)",
	"pgbouncer cannot connect to server",
}

// IsPoolerNoServer reports whether err is PgBouncer refusing a query it
// found no server for: nothing reached PostgreSQL, so the work is safe to
// try again (PgBouncer closes that client connection). Its other errors,
// "server conn crashed?" above all, come after the query was sent.
func IsPoolerNoServer(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != PoolerError {
		return false
	}
	for _, m := range poolerNoServer {
		if pe.Message == m {
			return true
		}
	}
	return false
}
