// Package dbnode turns a registry entry (bucketmap.Node) into a PostgreSQL
// connection: the DSN from ZooKeeper plus the password from where its
// reference points (an environment variable or a file), so that passwords
// are never stored in ZooKeeper nor logged.
package dbnode

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	if err := reloadTLS(n, n.DSN, &cfg.Config); err != nil {
		return nil, err
	}
	return cfg, nil
}

// PoolConfig is the pgxpool configuration of a node's direct path (its
// DSN): sessions and replication, for the mover, GC, schema changes.
func PoolConfig(n bucketmap.Node) (*pgxpool.Config, error) {
	return poolConfig(n, n.DSN, "dsn")
}

// The application path's pool defaults: what a prefork worker needs, one
// request at a time, plus one for a second statement while the first
// connection is being discarded. 800 processes × 2 on 4 nodes is what a
// pooler in front of each node has to take, rather than 800 × NumCPU
// server backends. A DSN's pool_max_conns or pool_max_conn_idle_time
// wins; a router's TunePool wins over both.
const (
	AppMaxConns        = 2
	AppMaxConnIdleTime = time.Minute
)

// AppPoolConfig is the pgxpool configuration of a node's application
// path: its pooler (PoolDSN) when it has one, else its DSN, with the
// application defaults above. Through a pooler the default exec mode is
// cache_describe: PgBouncer in transaction mode (1.18, before
// max_prepared_statements) hands each transaction whichever server
// connection is free, so pgx's default of named prepared statements would
// meet servers that never saw them. cache_describe keeps one round trip
// per query once a statement's description is cached, using only the
// unnamed statement. A DSN's own default_query_exec_mode wins.
func AppPoolConfig(n bucketmap.Node) (*pgxpool.Config, error) {
	dsn, what := n.DSN, "dsn"
	if n.Pooled() {
		dsn, what = n.PoolDSN, "pool dsn"
	}
	cfg, err := poolConfig(n, dsn, what)
	if err != nil {
		return nil, err
	}
	params, err := appSizes(n, dsn, what, cfg)
	if err != nil {
		return nil, err
	}
	if _, set := params["default_query_exec_mode"]; !set && n.Pooled() {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	return cfg, nil
}

// SessionPoolConfig is an application's escape hatch past the pooler: the
// direct path (the DSN) in pgx's default mode, sized as the application
// path is unless the DSN says otherwise (router.DirectPool).
func SessionPoolConfig(n bucketmap.Node) (*pgxpool.Config, error) {
	cfg, err := PoolConfig(n)
	if err != nil {
		return nil, err
	}
	if _, err := appSizes(n, n.DSN, "dsn", cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// appSizes gives cfg the application defaults the DSN does not set, and
// returns the DSN's settings.
func appSizes(n bucketmap.Node, dsn, what string, cfg *pgxpool.Config) (map[string]string, error) {
	params, err := dsnParams(dsn)
	if err != nil {
		return nil, fmt.Errorf("db node %s: %s: %w", n.ID, what, err)
	}
	if _, set := params["pool_max_conns"]; !set {
		cfg.MaxConns = AppMaxConns
	}
	if _, set := params["pool_max_conn_idle_time"]; !set {
		cfg.MaxConnIdleTime = AppMaxConnIdleTime
	}
	return params, nil
}

func poolConfig(n bucketmap.Node, dsn, what string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("db node %s: %s: %w", n.ID, what, err)
	}
	if err := configure(n, cfg.ConnConfig); err != nil {
		return nil, err
	}
	if err := reloadTLS(n, dsn, &cfg.ConnConfig.Config); err != nil {
		return nil, err
	}
	if len(cfg.ConnConfig.Fallbacks) > 0 {
		preferPrimary(cfg)
	}
	return cfg, nil
}

// preferPrimary makes a pool of a multi-host DSN try the host that last
// gave it a read-write connection first. libpq and pgx try the hosts in
// the DSN's order, so after a failover every new connection would first
// wait out the connect timeout on a host that vanished from the network
// (a SIGKILLed server refuses at once; a dead host does not answer);
// this way only the pool's first connection after a failover pays it.
func preferPrimary(cfg *pgxpool.Config) {
	var last atomic.Pointer[string]
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		if p := last.Load(); p != nil {
			reorderHosts(cc, *p)
		}
		return nil
	}
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		pc := c.PgConn().Conn()
		if pc == nil {
			return nil
		}
		// The validated (read-write) server: the config's host as
		// dialled is not kept, the remote address is.
		addr := pc.RemoteAddr().String()
		last.Store(&addr)
		return nil
	}
}

// reorderHosts moves the entries that dial addr (host:port, as a remote
// address reads) to the front, keeping the order of the rest.
func reorderHosts(cc *pgx.ConnConfig, addr string) {
	all := append([]*pgconn.FallbackConfig{{Host: cc.Host, Port: cc.Port, TLSConfig: cc.TLSConfig}}, cc.Fallbacks...)
	want, wantPort, err := net.SplitHostPort(addr)
	if err != nil {
		return
	}
	// The remote address is an IP; a DSN may name hosts: resolve them
	// (the resolver caches; pgconn resolves them again to dial anyway).
	match := func(f *pgconn.FallbackConfig) bool {
		if strconv.Itoa(int(f.Port)) != wantPort {
			return false
		}
		if f.Host == want {
			return true
		}
		if net.ParseIP(f.Host) != nil || strings.HasPrefix(f.Host, "/") {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		ips, err := net.DefaultResolver.LookupHost(ctx, f.Host)
		if err != nil {
			return false
		}
		for _, ip := range ips {
			if ip == want {
				return true
			}
		}
		return false
	}
	if match(all[0]) {
		return
	}
	var front, back []*pgconn.FallbackConfig
	for _, f := range all {
		if match(f) {
			front = append(front, f)
		} else {
			back = append(back, f)
		}
	}
	if len(front) == 0 {
		return
	}
	all = append(front, back...)
	cc.Host, cc.Port, cc.TLSConfig = all[0].Host, all[0].Port, all[0].TLSConfig
	cc.Fallbacks = all[1:]
}

// configure sets the password from the node's reference, and a connect
// timeout and an application_name when the DSN (or PGAPPNAME) sets none.
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
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = ApplicationName
	}
	return nil
}

// ApplicationName is the application_name of the connections this package
// opens when their DSN names none: "shardvisor/" and the program's name
// (shardvisor/shardctl, shardvisor/router, shardvisor/myapp for a Go
// application using the router library), so that an operator tells them
// apart in pg_stat_activity, pg_stat_replication and the server's log,
// where they were "[unknown]". PostgreSQL keeps its first 63 bytes.
var ApplicationName = "shardvisor/" + programName(os.Args)

// programName is the base name of the running program (argv[0]), or
// "unknown".
func programName(args []string) string {
	if len(args) == 0 || args[0] == "" {
		return "unknown"
	}
	name := args[0][strings.LastIndexByte(args[0], '/')+1:]
	if name == "" {
		return "unknown"
	}
	return name
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
// connects from one node to another). A node with a StreamUser gets that
// user and no password: the subscriber's client certificate logs it in. A group's multi-host DSN keeps its
// host list and target_session_attrs, so the subscriber follows the
// group's primary as every other client does. Never log it.
func ConnString(n bucketmap.Node) (string, error) {
	cfg, err := ConnConfig(n)
	if err != nil {
		return "", err
	}
	hosts, ports := []string{cfg.Host}, []string{strconv.Itoa(int(cfg.Port))}
	seen := map[string]bool{cfg.Host + ":" + ports[0]: true}
	// pgx lists each host once per TLS attempt (sslmode=prefer tries TLS,
	// then plain): keep the first of each.
	for _, f := range cfg.Fallbacks {
		k := f.Host + ":" + strconv.Itoa(int(f.Port))
		if !seen[k] {
			seen[k] = true
			hosts = append(hosts, f.Host)
			ports = append(ports, strconv.Itoa(int(f.Port)))
		}
	}
	s := fmt.Sprintf("host=%s port=%s dbname=%s", quote(strings.Join(hosts, ",")), quote(strings.Join(ports, ",")), quote(cfg.Database))
	if n.StreamUser != "" {
		// The subscriber's server proves who it is with its client
		// certificate (its libpq's default, ~/.postgresql/postgresql.crt
		// of the server's OS user): no password in the catalog.
		s += " user=" + quote(n.StreamUser)
	} else {
		s += " user=" + quote(cfg.User) + " password=" + quote(cfg.Password)
	}
	params, err := dsnParams(n.DSN)
	if err != nil {
		return "", fmt.Errorf("db node %s: %w", n.ID, err)
	}
	if a := cfg.RuntimeParams["target_session_attrs"]; a != "" {
		s += " target_session_attrs=" + quote(a)
	} else if a := params["target_session_attrs"]; a != "" {
		s += " target_session_attrs=" + quote(a)
	}
	// The DSN's TLS settings go along: without them libpq falls back to
	// sslmode=prefer, which never verifies a certificate (a subscriber
	// would then talk to whoever answers). Their file paths are the
	// subscriber's: the db hosts keep the same layout.
	for _, k := range connStringTLS {
		if v, ok := params[k]; ok {
			if n.StreamUser != "" && (k == "sslcert" || k == "sslkey") {
				// The DSN's client certificate is its Go clients'
				// (a web head's); the subscriber presents its own.
				continue
			}
			s += " " + k + "=" + quote(v)
		}
	}
	if cfg.ConnectTimeout > 0 {
		s += fmt.Sprintf(" connect_timeout=%d", max(1, int(cfg.ConnectTimeout/time.Second)))
	}
	return s, nil
}

// connStringTLS are the libpq settings of a DSN that ConnString keeps:
// how the subscriber verifies the server and proves who it is.
var connStringTLS = []string{"sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "sslcrldir", "sslsni", "ssl_min_protocol_version", "ssl_max_protocol_version"}

// dsnParams returns a DSN's settings as written, a URL's query or a
// key=value string's pairs (pgx accepts both and keeps no such list).
func dsnParams(dsn string) (map[string]string, error) {
	out := map[string]string{}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, fmt.Errorf("DSN: %w", err)
		}
		for k, v := range u.Query() {
			out[k] = v[len(v)-1]
		}
		return out, nil
	}
	// key=value pairs, values optionally in single quotes with \ and \'.
	s := strings.TrimSpace(dsn)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return nil, fmt.Errorf("DSN: %q is not key=value", s)
		}
		key := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t")
		var val strings.Builder
		if strings.HasPrefix(s, "'") {
			i, closed := 1, false
			for i < len(s) {
				switch {
				case s[i] == '\\' && i+1 < len(s):
					val.WriteByte(s[i+1])
					i += 2
					continue
				case s[i] == '\'':
					closed = true
				}
				if closed {
					break
				}
				val.WriteByte(s[i])
				i++
			}
			if !closed {
				return nil, fmt.Errorf("DSN: the value of %s is never closed", key)
			}
			s = s[i+1:]
		} else {
			j := strings.IndexAny(s, " \t")
			if j < 0 {
				j = len(s)
			}
			val.WriteString(s[:j])
			s = s[j:]
		}
		out[key] = val.String()
		s = strings.TrimLeft(s, " \t")
	}
	return out, nil
}

func quote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// Incarnation says which server a connection reached and in which life:
// the cluster's system identifier, the timeline it writes on, and the
// server's address. A Patroni failover or switchover promotes another
// member, which starts a new timeline at another address, so the value
// changes; a plain restart of the same server keeps it (its replication
// slots survive a restart). A move records both nodes' incarnations when
// it starts and aborts when either changes: replication slots do not
// survive a failover in PostgreSQL 15, and a subscriber that fails over
// may have confirmed changes its standby never received.
type Incarnation struct {
	SystemID string `json:"system_id"`
	Timeline int    `json:"timeline"`
	Server   string `json:"server"` // host:port as the server sees itself
}

func (i Incarnation) String() string {
	return fmt.Sprintf("%s on timeline %d at %s", i.SystemID, i.Timeline, i.Server)
}

// Querier is what Identify needs: a *pgx.Conn, a pool or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrStandby is returned by Identify for a server in recovery: a standby,
// where writes and logical replication slots are not possible.
var ErrStandby = fmt.Errorf("the server is a standby (in recovery), not a primary")

// Identify reads the incarnation of the server q is connected to. The
// timeline is the one the server writes WAL on now (pg_walfile_name of
// the current LSN), which a promotion changes at once; the checkpoint's
// timeline would lag until the next checkpoint.
func Identify(ctx context.Context, q Querier) (Incarnation, error) {
	return scanIdentity(q.QueryRow(ctx, identifySQL))
}

// QueueIdentify queues Identify's query on b, so that it costs no round
// trip of its own: reading b's results sets *inc, or *err (ErrStandby
// included), as Identify returns them. The batch's Close returns nil even
// when err is set.
func QueueIdentify(b *pgx.Batch, inc *Incarnation, err *error) {
	b.Queue(identifySQL).QueryRow(func(row pgx.Row) error {
		*inc, *err = scanIdentity(row)
		return nil
	})
}

const identifySQL = `SELECT pg_is_in_recovery(),
		(SELECT system_identifier::text FROM pg_control_system()),
		CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_walfile_name(pg_current_wal_lsn()) END,
		coalesce(host(inet_server_addr()), 'local') || ':' || coalesce(inet_server_port(), 0)`

func scanIdentity(row pgx.Row) (Incarnation, error) {
	var inc Incarnation
	var recovery bool
	var walfile *string
	if err := row.Scan(&recovery, &inc.SystemID, &walfile, &inc.Server); err != nil {
		return Incarnation{}, err
	}
	if recovery || walfile == nil {
		return inc, ErrStandby
	}
	tl, err := strconv.ParseUint((*walfile)[:8], 16, 32)
	if err != nil {
		return Incarnation{}, fmt.Errorf("reading the timeline from %q: %v", *walfile, err)
	}
	inc.Timeline = int(tl)
	return inc, nil
}
