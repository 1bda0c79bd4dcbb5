package testenv

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
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/internal/devenv"
)

// PG is a set of PostgreSQL nodes for one test, each with a fresh database.
type PG struct {
	Nodes []*PGNode

	// admins are StartPGNodes' connections to each node's "postgres"
	// database, kept from the CREATE DATABASE for the drop at the end
	// (nil: connect then).
	admins []*pgx.Conn
}

// PGNode is one PostgreSQL server and the test's database on it.
type PGNode struct {
	Index int    // 0-based position in PG.Nodes
	Name  string // "pg1", "pg2", ...
	Host  string // "127.0.0.1"
	Port  int
	User  string // "postgres" (superuser)
	// Password of User, also stored in PasswordFile (just the password, one
	// line) and PGPassFile (libpq/pgx pgpass format, usable as PGPASSFILE).
	Password     string
	PasswordFile string
	PGPassFile   string
	// Database is the test's own database, created by StartPG with the same
	// name on every node and dropped when the test ends.
	Database string
	// DSN connects to Database without a password:
	// postgres://postgres@127.0.0.1:PORT/DB?sslmode=disable (verify-full
	// against the environment's CA with SHARDVISOR_DEVENV_TLS=1)
	DSN string
	// DSNWithPassword is DSN with the password in it.
	DSNWithPassword string
	// AdminDSN connects to the "postgres" database, with the password.
	AdminDSN string

	// The node's PgBouncer (transaction mode), for nodes the environment
	// manages: PoolPort is its port (the server's + 2000), PoolDSN and
	// PoolDSNWithPassword are DSN and DSNWithPassword through it, to the
	// same Database with the same TLS parameters. Through it a client
	// must not keep session state across transactions nor use named
	// prepared statements (pgx: default_query_exec_mode=cache_describe,
	// exec or simple_protocol). Any role with a password logs in with it,
	// as itself. Empty (0) for servers given by SHARDVISOR_TEST_PG.
	PoolPort            int
	PoolDSN             string
	PoolDSNWithPassword string

	// A Patroni group (StartPGGroups) also has these; its DSNs list every
	// member with target_session_attrs=read-write.
	Members          []string // "127.0.0.1:PORT" of each member, member 1 first
	PatroniScope     string   // "pg5"
	PatroniNamespace string   // "/service/"
	APIPorts         []int    // each member's Patroni REST API port (127.0.0.1)

	st      *testState
	managed bool
	num     int  // scripts/devenv node number if not Index+1
	group   bool // a Patroni group
}

// number is the node's scripts/devenv node number.
func (n *PGNode) number() int {
	if n.num > 0 {
		return n.num
	}
	return n.Index + 1
}

// StartPG returns the PostgreSQL nodes (SHARDVISOR_PG_NODES, default 3),
// starting them if needed, each with a fresh database for the test. It skips
// the test under -short and fails it if the servers cannot be had.
func StartPG(t testing.TB) *PG {
	t.Helper()
	return StartPGNodes(t, 0)
}

// StartPGNodes is StartPG with n nodes (n <= 0: the default). Managed nodes
// missing from the environment are created (scripts/devenv up with
// SHARDVISOR_PG_NODES=n); with SHARDVISOR_TEST_PG it fails if fewer are given.
func StartPGNodes(t testing.TB, n int) *PG {
	t.Helper()
	skipIfShort(t)
	st := stateFor(t)
	if err := acquireShared(st); err != nil {
		fatalf(t, "lock: %v", err)
	}

	dbName := "t_" + sanitize(t.Name(), 40) + "_" + randomHex(4)
	pg := &PG{}
	if ext := externalPG(); len(ext) > 0 {
		if n <= 0 {
			n = len(ext)
		}
		if n > len(ext) {
			fatalf(t, "test wants %d PostgreSQL nodes, SHARDVISOR_TEST_PG gives %d", n, len(ext))
		}
		for i := 0; i < n; i++ {
			node, err := externalNode(t, i, ext[i], dbName)
			if err != nil {
				fatalf(t, "SHARDVISOR_TEST_PG entry %d: %v", i+1, err)
			}
			node.st = st
			pg.Nodes = append(pg.Nodes, node)
		}
	} else {
		if n <= 0 {
			n = pgNodesWanted()
		}
		if err := ensureUp(n); err != nil {
			fatalf(t, "starting servers: %v", err)
		}
		for i := 1; i <= n; i++ {
			if isGroupNode(i) {
				fatalf(t, "test wants %d plain PostgreSQL nodes, but node %d is a Patroni group (StartPGGroups uses nodes %d..); remove it (scripts/devenv pg-stop %d && rm -rf %s) or ask for fewer nodes",
					n, i, GroupFirstNode, i, filepath.Join(StateDir(), "pg", "pg"+strconv.Itoa(i)))
			}
		}
		pwFile := filepath.Join(StateDir(), "pg", "password")
		b, err := os.ReadFile(pwFile)
		if err != nil {
			fatalf(t, "reading PostgreSQL password: %v", err)
		}
		pw := strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
		for i := 0; i < n; i++ {
			node := &PGNode{
				Index:        i,
				Name:         "pg" + strconv.Itoa(i+1),
				Host:         "127.0.0.1",
				Port:         pgPortBase() + i,
				User:         "postgres",
				Password:     pw,
				PasswordFile: pwFile,
				PGPassFile:   filepath.Join(StateDir(), "pg", "pgpass"),
				Database:     dbName,
				PoolPort:     poolPort(pgPortBase() + i),
				st:           st,
				managed:      true,
			}
			node.fillDSNs()
			pg.Nodes = append(pg.Nodes, node)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, len(pg.Nodes))
	pg.admins = make([]*pgx.Conn, len(pg.Nodes))
	var wg sync.WaitGroup
	for i, node := range pg.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := pgx.Connect(ctx, node.AdminDSN)
			if err != nil {
				errs[i] = err
				return
			}
			pg.admins[i] = c
			// FILE_COPY: PostgreSQL 15's default (WAL_LOG) writes the
			// template's every page to WAL, 4.2 MB per database, which
			// every server archives (pgBackRest); a file copy logs 888 B.
			_, errs[i] = c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{dbName}.Sanitize()+" STRATEGY = FILE_COPY")
		}()
	}
	wg.Wait()
	// Register the drop before failing, so databases created on other nodes
	// are dropped too.
	st.addCleanup(func() { pg.dropDatabases(t) })
	for i, err := range errs {
		if err != nil {
			fatalf(t, "creating database %s on %s: %v", dbName, pg.Nodes[i].Name, err)
		}
	}
	return pg
}

func (n *PGNode) fillDSNs() {
	mk := func(port int, user *url.Userinfo, db string) string {
		u := url.URL{Scheme: "postgres", User: user, Host: net.JoinHostPort(n.Host, strconv.Itoa(port)), Path: "/" + db, RawQuery: managedSSL()}
		return u.String()
	}
	n.DSN = mk(n.Port, url.User(n.User), n.Database)
	n.DSNWithPassword = mk(n.Port, url.UserPassword(n.User, n.Password), n.Database)
	n.AdminDSN = mk(n.Port, url.UserPassword(n.User, n.Password), "postgres")
	if n.PoolPort != 0 {
		n.PoolDSN = mk(n.PoolPort, url.User(n.User), n.Database)
		n.PoolDSNWithPassword = mk(n.PoolPort, url.UserPassword(n.User, n.Password), n.Database)
	}
}

// poolPort is the port of the managed environment's PgBouncer in front of
// the server on port (devenv: 2000 above it).
func poolPort(port int) int {
	e := devenv.New(devenv.Config{PGPortBase: port})
	return e.PoolPort(1)
}

// SSLParams is the TLS query a test's own DSN to the managed environment's
// servers needs (managedSSL).
func SSLParams() string { return managedSSL() }

// managedSSL is the TLS query of the managed environment's DSNs:
// sslmode=disable in the tests' plain mode, verify-full against its CA
// with SHARDVISOR_DEVENV_TLS=1 (its servers then take TCP over TLS only).
func managedSSL() string {
	c, err := devenv.FromEnv()
	if err != nil {
		return "sslmode=disable"
	}
	return devenv.New(c).PGSSLParams()
}

// externalNode builds a node from an admin DSN given in SHARDVISOR_TEST_PG.
func externalNode(t testing.TB, i int, dsn, db string) (*PGNode, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("want a postgres:// URL, got %q", dsn)
	}
	host, portStr, err := net.SplitHostPort(u.Host)
	if err != nil {
		host, portStr = u.Host, "5432"
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("bad port in %q", dsn)
	}
	user := "postgres"
	pw := os.Getenv("PGPASSWORD")
	if u.User != nil {
		user = u.User.Username()
		if p, ok := u.User.Password(); ok {
			pw = p
		}
	}
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "password")
	pgpass := filepath.Join(dir, "pgpass")
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		return nil, err
	}
	esc := strings.NewReplacer(`\`, `\\`, `:`, `\:`).Replace
	if err := os.WriteFile(pgpass, []byte(fmt.Sprintf("%s:%d:*:%s:%s\n", esc(host), port, esc(user), esc(pw))), 0o600); err != nil {
		return nil, err
	}
	n := &PGNode{
		Index: i, Name: "pg" + strconv.Itoa(i+1), Host: host, Port: port,
		User: user, Password: pw, PasswordFile: pwFile, PGPassFile: pgpass, Database: db,
	}
	n.fillDSNs()
	// Keep the external URL's other parameters for the admin connection.
	q := u.Query()
	if q.Get("sslmode") == "" {
		q.Set("sslmode", "disable")
	}
	for _, target := range []*string{&n.DSN, &n.DSNWithPassword, &n.AdminDSN} {
		tu, _ := url.Parse(*target)
		tu.RawQuery = q.Encode()
		*target = tu.String()
	}
	return n, nil
}

// admin runs statements on the node's "postgres" database.
func (n *PGNode) admin(ctx context.Context, sqls ...string) error {
	return Exec(ctx, n.AdminDSN, sqls...)
}

// Exec runs statements one by one on one connection to dsn; the error
// names the statement that failed.
func Exec(ctx context.Context, dsn string, sqls ...string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, s := range sqls {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// Conn opens a connection to the test's database on this node (with the
// password), closed when the test ends.
func (n *PGNode) Conn(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.DSNWithPassword)
	if err != nil {
		t.Fatalf("testenv: connecting to %s: %v", n.Name, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// dropDatabases removes the test's databases: first the subscriptions in
// them on every node (their workers hold replication slots on other nodes),
// then the replication slots of them, then the databases. One admin
// connection per node does it: pg_subscription is a shared catalog, so the
// test's own database is opened only when it holds subscriptions (a
// backend's start and exit is ~35 ms of a 2-core test machine's CPU, and
// every test pays this).
func (pg *PG) dropDatabases(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admins := make([]*pgx.Conn, len(pg.Nodes))
	defer func() {
		for _, c := range admins {
			if c != nil {
				c.Close(context.Background())
			}
		}
	}()
	for i, n := range pg.Nodes {
		// The connection kept from the start, unless the test restarted
		// the server or ended the backend under it.
		var c *pgx.Conn
		if i < len(pg.admins) && pg.admins[i] != nil {
			c, pg.admins[i] = pg.admins[i], nil
			if c.Ping(ctx) != nil {
				c.Close(context.Background())
				c = nil
			}
		}
		if c == nil {
			var err error
			if c, err = pgx.Connect(ctx, n.AdminDSN); err != nil {
				t.Errorf("testenv: cleanup on %s: %v", n.Name, err)
				continue
			}
		}
		admins[i] = c
		if err := n.dropSubscriptions(ctx, c); err != nil {
			t.Errorf("testenv: cleanup on %s: %v", n.Name, err)
		}
	}
	var wg sync.WaitGroup
	for i, n := range pg.Nodes {
		if admins[i] == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := dropDatabaseOn(ctx, admins[i], n.Database); err != nil {
				t.Errorf("testenv: cleanup on %s: %v", n.Name, err)
			}
		}()
	}
	wg.Wait()
}

// dropSubscriptions drops the subscriptions of the node's test database,
// found through admin (on the "postgres" database); only if there are any
// does it connect to the test's database, where they must be dropped.
func (n *PGNode) dropSubscriptions(ctx context.Context, admin *pgx.Conn) error {
	rows, err := admin.Query(ctx, `SELECT subname FROM pg_subscription WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = $1)`, n.Database)
	if err != nil {
		return err
	}
	subs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(subs) == 0 {
		return err
	}
	conn, err := pgx.Connect(ctx, n.DSNWithPassword)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, s := range subs {
		id := pgx.Identifier{s}.Sanitize()
		for _, q := range []string{
			"ALTER SUBSCRIPTION " + id + " DISABLE",
			"ALTER SUBSCRIPTION " + id + " SET (slot_name = NONE)",
			"DROP SUBSCRIPTION " + id,
		} {
			if _, err := conn.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
	}
	return nil
}

// DropDatabase drops db through adminDSN, with its replication slots:
// slots of the database (created by subscriptions elsewhere) block DROP
// DATABASE, and active ones must lose their walsender first, which may
// take a moment, so it tries up to 50 times, 100 ms apart.
func DropDatabase(ctx context.Context, adminDSN, db string) error {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return dropDatabaseOn(ctx, conn, db)
}

// dropDatabaseOn is DropDatabase on an open admin connection.
func dropDatabaseOn(ctx context.Context, conn *pgx.Conn, db string) error {
	for attempt := 0; ; attempt++ {
		_, err := conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, db)
		if err == nil {
			_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, db)
		}
		if err == nil {
			_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
		}
		if err == nil || attempt >= 50 || ctx.Err() != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond) // a terminated walsender may still hold its slot
	}
}

func (n *PGNode) control() error {
	if !n.managed {
		return ErrNotManaged
	}
	if n.st == nil || !n.st.isExclusive() {
		return ErrNotExclusive
	}
	return nil
}

// Stop stops this node (pg_ctl stop -m fast) and returns when it is down.
// Requires Exclusive.
func (n *PGNode) Stop() error {
	if err := n.control(); err != nil {
		return err
	}
	return n.devenvDo("pg-stop", func(e *devenv.Env) error { return e.PGStop(n.number()) })
}

// Start starts this node and returns when it accepts connections.
// Requires Exclusive.
func (n *PGNode) Start() error {
	if err := n.control(); err != nil {
		return err
	}
	return n.devenvDo("pg-start", func(e *devenv.Env) error { return e.PGStart(n.number()) })
}

// devenvDo runs f on the managed environment; the error names the node.
func (n *PGNode) devenvDo(what string, f func(*devenv.Env) error) error {
	return devenvDo(what+" "+strconv.Itoa(n.number()), nil, f)
}
