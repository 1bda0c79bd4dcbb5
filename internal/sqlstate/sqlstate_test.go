package sqlstate

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestIsPoolerNoServer: PgBouncer's errors for a query that found no
// server are told from its errors after the query was sent, and from
// PostgreSQL's own errors of the same SQLSTATE.
func TestIsPoolerNoServer(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "server login has been failing, try again later (server_login_retry)"}, true},
		{fmt.Errorf("exec: %w", &pgconn.PgError{Code: "08P01", Message: "query_wait_timeout"}), true},
		{&pgconn.PgError{Code: "08P01", Message: "client_login_timeout (server down)"}, true},
		{&pgconn.PgError{Code: "08P01", Message: "pgbouncer cannot connect to server"}, true},
		{&pgconn.PgError{Code: "08P01", Message: "server login has been failing, cached error: connect failed (server_login_retry)"}, true},
		// Sent, then lost: the outcome is unknown.
		{&pgconn.PgError{Code: "08P01", Message: "server conn crashed?"}, false},
		{&pgconn.PgError{Code: "08P01", Message: "server connection closed"}, false},
		// PostgreSQL's own protocol violation, and the same text under
		// another SQLSTATE.
		{&pgconn.PgError{Code: "08P01", Message: "invalid frontend message type 0"}, false},
		{&pgconn.PgError{Code: "57P01", Message: "query_wait_timeout"}, false},
		{errors.New("query_wait_timeout"), false},
		{nil, false},
	} {
		if got := IsPoolerNoServer(tc.err); got != tc.want {
			t.Errorf("IsPoolerNoServer(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
