package clustertest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// DevSpec is where a benchmark runs on scripts/devenv's servers.
type DevSpec struct {
	// Dir is scripts/devenv's state directory (password file, lock).
	Dir string
	// Lock holds the test environment's shared lock while the run lasts,
	// as every integration test does, so that a disruptive test waits
	// for the run, and it for them.
	Lock bool
	// Nodes servers from PGHost:PGPortBase on, one port each.
	PGHost     string
	PGPortBase int
	Nodes      int
	// DB is the database created on every server.
	DB string
	// ZK is the ensemble's connect string; TLS: it takes clients over TLS
	// only, the Dev's session dials it as Admin (tls.go).
	ZK  string
	TLS bool
	// Pooler gives every node its application path through the server's
	// PgBouncer (devenv.PoolPortOffset above it): the router's pools go
	// through it, the mover and the loads' setup directly.
	Pooler bool
	// Keep leaves the databases and the ZooKeeper trees at Close.
	Keep bool
	// Logf reports what Close could not clean up.
	Logf func(format string, args ...any)
}

// Dev is a fresh database on each of the servers, registered as db nodes
// pg1..pgN, and a ZooKeeper session: what a benchmark builds its cluster
// in. Close releases all of it.
type Dev struct {
	Nodes []bucketmap.Node
	// Admin is the superuser's DSN for each server's postgres database.
	Admin   []string
	PWFile  string
	Session *zksession.Session

	sp      DevSpec
	created int
	roots   []topo.Paths
	release func()
}

// OpenDev takes the lock, creates the databases and opens the session.
// On an error it has released what it took.
func OpenDev(ctx context.Context, sp DevSpec) (_ *Dev, err error) {
	d := &Dev{sp: sp, PWFile: PasswordFile(sp.Dir)}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if sp.Lock {
		// testenv's lock lives in its state directory: this run's.
		os.Setenv("SHARDVISOR_DEVENV_DIR", sp.Dir)
		if d.release, err = testenv.Share(); err != nil {
			return nil, fmt.Errorf("test environment lock: %w", err)
		}
	}
	password, err := ReadPassword(d.PWFile)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL password (scripts/devenv up): %w", err)
	}
	var addrs []string
	for i := range sp.Nodes {
		addrs = append(addrs, net.JoinHostPort(sp.PGHost, strconv.Itoa(sp.PGPortBase+i)))
		d.Admin = append(d.Admin, AdminDSN(addrs[i], password, DevSSL(sp.Dir, sp.TLS)))
	}
	d.Nodes = DevNodes(addrs, sp.DB, d.PWFile, DevSSL(sp.Dir, sp.TLS))
	if sp.Pooler {
		for i := range d.Nodes {
			d.Nodes[i].PoolDSN = PoolDSN(d.Nodes[i].DSN)
		}
	}
	for i := range d.Nodes {
		if err := testenv.Exec(ctx, d.Admin[i], "CREATE DATABASE "+pgx.Identifier{sp.DB}.Sanitize()); err != nil {
			return nil, fmt.Errorf("%s: %w (is it up? SHARDVISOR_PG_NODES=%d scripts/devenv --plain up)", d.Nodes[i].ID, err, sp.Nodes)
		}
		d.created++
	}
	if d.Session, err = d.SessionAs(ctx, Admin); err != nil {
		return nil, err
	}
	return d, nil
}

// DeleteAtClose has Close delete the ZooKeeper tree of the cluster at p.
func (d *Dev) DeleteAtClose(p topo.Paths) { d.roots = append(d.roots, p) }

// Close deletes the trees, closes the session, drops the databases
// (unless Keep) and releases the lock.
func (d *Dev) Close() {
	if d.Session != nil {
		if !d.sp.Keep {
			for _, p := range d.roots {
				cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				if err := topo.DeleteRoot(cctx, d.Session, p); err != nil {
					d.logf("cleanup: ZooKeeper %s: %v", p.Root, err)
				}
				cancel()
			}
		}
		d.Session.Close()
	}
	if !d.sp.Keep && d.created > 0 {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		var wg sync.WaitGroup
		for i := range d.created {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := DropDatabase(cctx, d.Admin[i], d.sp.DB, d.logf); err != nil {
					d.logf("cleanup: %s: dropping %s: %v", d.Nodes[i].ID, d.sp.DB, err)
				}
			}()
		}
		wg.Wait()
		cancel()
	}
	if d.release != nil {
		d.release()
	}
}

func (d *Dev) logf(format string, args ...any) {
	if d.sp.Logf != nil {
		d.sp.Logf(format, args...)
	}
}

// DevNodes registers the servers at addrs (host:port) as db nodes
// pg1..pgN on database db, as the superuser postgres with the password in
// pwFile, with the TLS query ssl (DevSSL).
func DevNodes(addrs []string, db, pwFile, ssl string) []bucketmap.Node {
	var out []bucketmap.Node
	for i, addr := range addrs {
		dsn := (&url.URL{Scheme: "postgres", User: url.User("postgres"), Host: addr, Path: "/" + db, RawQuery: ssl}).String()
		out = append(out, Node(fmt.Sprintf("pg%d", i+1), dsn, pwFile))
	}
	return out
}

// PoolDSN is a devenv node's DSN through its servers' PgBouncers: each
// host's port moved up by devenv.PoolPortOffset (a group's members each
// have one).
func PoolDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return ""
	}
	var hosts []string
	for _, hp := range strings.Split(u.Host, ",") {
		h, p, err := net.SplitHostPort(hp)
		if err != nil {
			return ""
		}
		n, _ := strconv.Atoi(p)
		hosts = append(hosts, net.JoinHostPort(h, strconv.Itoa(n+devenv.PoolPortOffset)))
	}
	u.Host = strings.Join(hosts, ",")
	return u.String()
}

// OpenSession opens a ZooKeeper session on connect and waits up to 30 s
// for it to connect; an error names how to start the ensemble (start).
func OpenSession(ctx context.Context, connect, start string) (*zksession.Session, error) {
	return OpenSessionWith(ctx, zksession.Config{Connect: connect}, start)
}

// OpenSessionWith is OpenSession with a session's configuration (its
// dialer, say).
func OpenSessionWith(ctx context.Context, cfg zksession.Config, start string) (*zksession.Session, error) {
	connect := cfg.Connect
	s, err := zksession.Open(cfg)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.WaitConnected(wctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("ZooKeeper at %s (%s): %w", connect, start, err)
	}
	return s, nil
}

// DropDatabase removes database db from the server at admin (the
// superuser's DSN): first the subscriptions a move left in it (their
// workers hold slots on other servers; they block DROP DATABASE), then
// its slots and the database (testenv.DropDatabase). logf reports a
// subscription it could not drop.
func DropDatabase(ctx context.Context, admin, db string, logf func(string, ...any)) error {
	u, err := url.Parse(admin)
	if err != nil {
		return err
	}
	u.Path = "/" + db
	if conn, err := pgx.Connect(ctx, u.String()); err == nil {
		rows, _ := conn.Query(ctx, `SELECT subname FROM pg_subscription WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())`)
		subs, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, s := range subs {
			id := pgx.Identifier{s}.Sanitize()
			for _, q := range []string{"ALTER SUBSCRIPTION " + id + " DISABLE", "ALTER SUBSCRIPTION " + id + " SET (slot_name = NONE)", "DROP SUBSCRIPTION " + id} {
				if _, err := conn.Exec(ctx, q); err != nil && logf != nil {
					logf("cleanup: %s %s: %v", u.Host, q, err)
				}
			}
		}
		conn.Close(context.Background())
	}
	return testenv.DropDatabase(ctx, admin, db)
}

// PasswordFile is where scripts/devenv keeps the PostgreSQL superuser's
// password in its state directory dir.
func PasswordFile(dir string) string { return filepath.Join(dir, "pg", "password") }

// ReadPassword reads the first line of a password file.
func ReadPassword(file string) (string, error) {
	pw, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(strings.SplitN(string(pw), "\n", 2)[0]), nil
}

// AdminDSN is the superuser's DSN for the postgres database at host
// (host:port), with the TLS query ssl (DevSSL).
func AdminDSN(host, password, ssl string) string {
	return (&url.URL{Scheme: "postgres", User: url.UserPassword("postgres", password), Host: host, Path: "/postgres", RawQuery: ssl}).String()
}
