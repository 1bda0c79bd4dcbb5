// Package dbnode turns a registry entry (bucketmap.Node) into a PostgreSQL
// connection: the DSN from ZooKeeper plus the password from where its
// reference points (an environment variable or a file), so that passwords
// are never stored in ZooKeeper nor logged.
package dbnode

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/bucketmap"
)

// Password resolves a node's password reference. "" means none: libpq's
// usual sources (PGPASSWORD, PGPASSFILE) still apply.
func Password(n bucketmap.Node) (string, error) {
	ref := n.Password
	switch {
	case ref == "":
		return "", nil
	case strings.HasPrefix(ref, "env:"):
		v, ok := os.LookupEnv(ref[4:])
		if !ok {
			return "", fmt.Errorf("db node %s: password reference %s: environment variable %s is not set", n.ID, ref, ref[4:])
		}
		return v, nil
	case strings.HasPrefix(ref, "file:"):
		b, err := os.ReadFile(ref[5:])
		if err != nil {
			return "", fmt.Errorf("db node %s: password reference %s: %w", n.ID, ref, err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		return strings.TrimRight(line, "\r"), nil
	}
	return "", fmt.Errorf("db node %s: password reference must be env:NAME or file:/path", n.ID)
}

// ConnConfig is the pgx configuration for a node.
func ConnConfig(n bucketmap.Node) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(n.DSN)
	if err != nil {
		return nil, fmt.Errorf("db node %s: dsn: %w", n.ID, err)
	}
	if err := configure(n, cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// PoolConfig is the pgxpool configuration for a node.
func PoolConfig(n bucketmap.Node) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(n.DSN)
	if err != nil {
		return nil, fmt.Errorf("db node %s: dsn: %w", n.ID, err)
	}
	if err := configure(n, cfg.ConnConfig); err != nil {
		return nil, err
	}
	return cfg, nil
}

// configure sets the password from the node's reference and a connect
// timeout when the DSN sets none.
func configure(n bucketmap.Node, cfg *pgx.ConnConfig) error {
	pw, err := Password(n)
	if err != nil {
		return err
	}
	if pw != "" {
		cfg.Password = pw
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	return nil
}

// Connect opens one connection to a node.
func Connect(ctx context.Context, n bucketmap.Node) (*pgx.Conn, error) {
	cfg, err := ConnConfig(n)
	if err != nil {
		return nil, err
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("db node %s (%s): %w", n.ID, n.DSN, err)
	}
	return c, nil
}

// ConnString is the node's DSN with the password filled in, for places
// that need a libpq connection string (a logical-replication subscription
// connects from one node to another). Never log it.
func ConnString(n bucketmap.Node) (string, error) {
	cfg, err := ConnConfig(n)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("host=%s port=%d dbname=%s user=%s password=%s", quote(cfg.Host), cfg.Port, quote(cfg.Database), quote(cfg.User), quote(cfg.Password)), nil
}

func quote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
