package dbnode

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/pki"
)

// pgx reads a DSN's sslrootcert, sslcert and sslkey once, when the DSN is
// parsed: a pool kept for days would go on trusting a CA rotated away and
// presenting a client certificate that expired. reloadTLS makes the
// configuration read them again, at each new connection, when they
// changed on disk (issue 41: rotation without restarts). Connections
// already open keep theirs.

// reloadTLS replaces the TLS configurations pgx made for cc (one per host
// and TLS attempt) with ones that reload the DSN's certificate files. A
// DSN without them, or whose key is encrypted (sslpassword), keeps pgx's.
func reloadTLS(n bucketmap.Node, dsn string, cc *pgconn.Config) error {
	params, err := dsnParams(dsn)
	if err != nil {
		return fmt.Errorf("db node %s: %w", n.ID, err)
	}
	ca, cert, key := params["sslrootcert"], params["sslcert"], params["sslkey"]
	if ca == "" && cert == "" || params["sslpassword"] != "" {
		return nil
	}
	r, err := pki.NewReloader(ca, cert, key)
	if err != nil {
		return fmt.Errorf("db node %s: %w", n.ID, err)
	}
	v := pki.VerifyNone
	switch params["sslmode"] {
	case "verify-full":
		v = pki.VerifyFull
	case "verify-ca":
		v = pki.VerifyCA
	case "require", "":
		// As libpq: with a root certificate, require checks the chain.
		if ca != "" {
			v = pki.VerifyCA
		}
	}
	if cc.TLSConfig != nil {
		cc.TLSConfig = r.ClientConfig(cc.TLSConfig, v)
	}
	for _, f := range cc.Fallbacks {
		if f.TLSConfig != nil {
			f.TLSConfig = r.ClientConfig(f.TLSConfig, v)
		}
	}
	return nil
}
