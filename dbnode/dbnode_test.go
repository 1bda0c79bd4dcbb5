package dbnode

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

func TestPasswordReferences(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "pw")
	os.WriteFile(f, []byte("from-file\nignored\n"), 0o600)
	t.Setenv("SV_TEST_PW", "from-env")
	for _, tc := range []struct{ ref, want, errHas string }{
		{"", "", ""},
		{"env:SV_TEST_PW", "from-env", ""},
		{"file:" + f, "from-file", ""},
		{"env:SV_TEST_MISSING", "", "SV_TEST_MISSING is not set"},
		{"file:" + filepath.Join(dir, "nope"), "", "no such file"},
		{"plaintext", "", "must be env:NAME"},
	} {
		got, err := Password(bucketmap.Node{ID: "n1", Password: tc.ref})
		if tc.errHas != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errHas) || !strings.Contains(err.Error(), "n1") {
				t.Errorf("%q: %v, want an error naming n1 and %q", tc.ref, err, tc.errHas)
			}
			if err != nil && strings.Contains(err.Error(), "plaintext") {
				t.Errorf("error echoes the bad reference: %v", err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %q %v", tc.ref, got, err)
		}
	}
}

func TestIntegrationConnectWithPasswordFile(t *testing.T) {
	pg := testenv.StartPG(t)
	n := pg.Nodes[0]
	node := bucketmap.Node{ID: "pg1", DSN: n.DSN, Password: "file:" + n.PasswordFile, Weight: 1, State: bucketmap.NodeActive}
	if err := bucketmap.ValidateNode(node); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Connect(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var db, app string
	if err := c.QueryRow(ctx, "select current_database(), current_setting('application_name')").Scan(&db, &app); err != nil || db != n.Database {
		t.Fatalf("connected to %q: %v", db, err)
	}
	// The server sees which program connected.
	if app != ApplicationName || !strings.HasPrefix(app, "shardvisor/") {
		t.Fatalf("application_name %q, want %q", app, ApplicationName)
	}
	// A wrong password fails with an error that names the node, not the password.
	bad := node
	bad.Password = "env:SV_WRONG_PW"
	t.Setenv("SV_WRONG_PW", "definitely-wrong")
	_, err = Connect(ctx, bad)
	if err == nil || !strings.Contains(err.Error(), "pg1") || strings.Contains(err.Error(), "definitely-wrong") {
		t.Fatalf("wrong password: %v", err)
	}
	cs, err := ConnString(node)
	if err != nil || !strings.Contains(cs, "password='") || !strings.Contains(cs, "port=") {
		t.Fatalf("conn string: %v", err)
	}
}

func TestConnStringKeepsTheHostList(t *testing.T) {
	t.Setenv("SV_TEST_PW", "s3cret")
	n := bucketmap.Node{ID: "g1", DSN: "postgres://app@10.0.0.1:5432,10.0.0.2:6432/appdb?target_session_attrs=read-write&connect_timeout=2&sslmode=prefer", Password: "env:SV_TEST_PW"}
	cs, err := ConnString(n)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"host='10.0.0.1,10.0.0.2'", "port='5432,6432'", "dbname='appdb'", "user='app'", "password='s3cret'", "target_session_attrs='read-write'", "connect_timeout=2"} {
		if !strings.Contains(cs, want) {
			t.Errorf("%s: missing %s", cs, want)
		}
	}
	one := bucketmap.Node{ID: "p1", DSN: "postgres://app@10.0.0.1/appdb"}
	cs, err = ConnString(one)
	if err != nil || !strings.Contains(cs, "host='10.0.0.1' port='5432'") || strings.Contains(cs, "target_session_attrs") {
		t.Fatalf("plain node: %s %v", cs, err)
	}
}

func TestIntegrationIdentify(t *testing.T) {
	pg := testenv.StartPG(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var incs []Incarnation
	for _, n := range pg.Nodes[:2] {
		c, err := Connect(ctx, bucketmap.Node{ID: "x", DSN: n.DSN, Password: "file:" + n.PasswordFile})
		if err != nil {
			t.Fatal(err)
		}
		inc, err := Identify(ctx, c)
		c.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if inc.SystemID == "" || inc.Timeline < 1 || !strings.HasSuffix(inc.Server, ":"+strconv.Itoa(n.Port)) {
			t.Fatalf("%s: %+v", n.Name, inc)
		}
		incs = append(incs, inc)
	}
	if incs[0] == incs[1] {
		t.Fatalf("two servers, one incarnation: %+v", incs[0])
	}
}

func TestReorderHostsPutsTheLastPrimaryFirst(t *testing.T) {
	n := bucketmap.Node{ID: "g1", DSN: "postgres://app@127.0.0.1:5001,127.0.0.1:5002,127.0.0.1:5003/db?target_session_attrs=read-write&sslmode=disable"}
	cfg, err := PoolConfig(n)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BeforeConnect == nil || cfg.AfterConnect == nil {
		t.Fatal("a multi-host pool has no host preference")
	}
	order := func(cc *pgx.ConnConfig) string {
		s := strconv.Itoa(int(cc.Port))
		for _, f := range cc.Fallbacks {
			s += "," + strconv.Itoa(int(f.Port))
		}
		return s
	}
	cc := cfg.ConnConfig.Copy()
	reorderHosts(cc, "127.0.0.1:5003")
	if got := order(cc); got != "5003,5001,5002" {
		t.Fatalf("order %s", got)
	}
	reorderHosts(cc, "127.0.0.1:9999") // unknown: unchanged
	if got := order(cc); got != "5003,5001,5002" {
		t.Fatalf("order %s", got)
	}
	// Hosts by name: the remote address a connection reports is an IP.
	named, err := PoolConfig(bucketmap.Node{ID: "g2", DSN: "postgres://app@db-a.invalid:5001,localhost:5002/db?target_session_attrs=read-write&sslmode=disable"})
	if err != nil {
		t.Fatal(err)
	}
	cc = named.ConnConfig.Copy()
	reorderHosts(cc, "127.0.0.1:5002")
	if cc.Host != "localhost" || cc.Port != 5002 {
		t.Fatalf("a host by name was not matched by its address: first %s:%d", cc.Host, cc.Port)
	}
	plain, _ := PoolConfig(bucketmap.Node{ID: "p", DSN: "postgres://app@127.0.0.1:5001/db?sslmode=disable"})
	if plain.BeforeConnect != nil {
		t.Fatal("a one-host pool got a host preference")
	}
}

// A subscription's connection string keeps the DSN's TLS settings: without
// them libpq falls back to sslmode=prefer, which never verifies the
// server (issue 41: the DSN's sslmode was dropped). Both DSN forms.
func TestConnStringKeepsTheTLSSettings(t *testing.T) {
	t.Setenv("SV_TEST_PW", "s3cret")
	// pgx reads the files as it parses the DSN.
	dir := t.TempDir()
	ca, err := pki.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.Identity{Role: "mover", Host: "db1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "db.pem"), filepath.Join(dir, "db.key")
	if err := ca.Write(caFile, filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	if err := leaf.Write(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	for _, dsn := range []string{
		"postgres://app@db1.example:5432/appdb?sslmode=verify-full&sslrootcert=" + caFile + "&sslcert=" + certFile + "&sslkey=" + keyFile,
		`host=db1.example port=5432 dbname=appdb user=app sslmode=verify-full sslrootcert='` + caFile + `' sslcert=` + certFile + ` sslkey='` + keyFile + `'`,
	} {
		cs, err := ConnString(bucketmap.Node{ID: "p1", DSN: dsn, Password: "env:SV_TEST_PW"})
		if err != nil {
			t.Fatalf("%s: %v", dsn, err)
		}
		for _, want := range []string{"sslmode='verify-full'", "sslrootcert='" + caFile + "'", "sslcert='" + certFile + "'", "sslkey='" + keyFile + "'", "host='db1.example'"} {
			if !strings.Contains(cs, want) {
				t.Errorf("%s: %s lacks %s", dsn, cs, want)
			}
		}
	}
	cs, err := ConnString(bucketmap.Node{ID: "p1", DSN: "postgres://app@10.0.0.1/appdb"})
	if err != nil || strings.Contains(cs, "ssl") {
		t.Fatalf("a DSN without TLS settings: %s %v", cs, err)
	}
}

func TestDSNParams(t *testing.T) {
	got, err := dsnParams(`host=h user='o\'neil' application_name='a b'  sslmode=require`)
	if err != nil || got["user"] != "o'neil" || got["application_name"] != "a b" || got["sslmode"] != "require" || got["host"] != "h" {
		t.Fatalf("%+v %v", got, err)
	}
	for _, bad := range []string{"host", "user='never closed"} {
		if _, err := dsnParams(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// A node with a stream user: its subscriptions log in as that role by the
// subscriber's certificate, so the conninfo has the role, the server's
// verification, and neither a password nor the DSN's client certificate
// (a Go client's, not the subscribing server's).
func TestConnStringStreamUserHasNoPassword(t *testing.T) {
	t.Setenv("SV_TEST_PW", "s3cret")
	dir := t.TempDir()
	ca, err := pki.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.Identity{Role: "webhead", Host: "web1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := pki.FilesIn(dir, "web")
	if err := ca.Write(f.CA, filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	if err := leaf.Write(f.Cert, f.Key); err != nil {
		t.Fatal(err)
	}
	n := bucketmap.Node{ID: "p1", DSN: "postgres://app@db1.example/appdb?sslmode=verify-full&sslrootcert=" + f.CA + "&sslcert=" + f.Cert + "&sslkey=" + f.Key,
		Password: "env:SV_TEST_PW", StreamUser: "shardvisor_stream"}
	cs, err := ConnString(n)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"password", "s3cret", "user='app'", "sslcert", "sslkey"} {
		if strings.Contains(cs, bad) {
			t.Errorf("%s: has %s", cs, bad)
		}
	}
	for _, want := range []string{"user='shardvisor_stream'", "sslmode='verify-full'", "sslrootcert='" + f.CA + "'", "host='db1.example'"} {
		if !strings.Contains(cs, want) {
			t.Errorf("%s: lacks %s", cs, want)
		}
	}
	// Without one, exactly as before.
	n.StreamUser = ""
	if cs, err := ConnString(n); err != nil || !strings.Contains(cs, "password='s3cret'") || !strings.Contains(cs, "user='app'") || !strings.Contains(cs, "sslcert='"+f.Cert+"'") {
		t.Fatalf("without a stream user: %s %v", cs, err)
	}
}

// The application path: a node's pooler when it has one, in an exec mode
// that uses no named prepared statements (PgBouncer 1.18 in transaction
// mode), sized for a prefork worker, with the node's password; a DSN's
// own settings win. Without a pooler, the DSN in pgx's default mode.
func TestAppPoolConfig(t *testing.T) {
	t.Setenv("SV_TEST_PW", "s3cret")
	n := bucketmap.Node{ID: "n1", DSN: "postgres://app@db1:5432/app", PoolDSN: "postgres://app@db1:6432/app", Password: "env:SV_TEST_PW"}
	cfg, err := AppPoolConfig(n)
	if err != nil {
		t.Fatal(err)
	}
	cc := cfg.ConnConfig
	if cc.Port != 6432 || cc.Password != "s3cret" {
		t.Errorf("pooled node: port %d password %q, want the pooler's 6432 with the node's password", cc.Port, cc.Password)
	}
	if cc.DefaultQueryExecMode != pgx.QueryExecModeCacheDescribe {
		t.Errorf("pooled node: exec mode %v, want cache describe", cc.DefaultQueryExecMode)
	}
	if cfg.MaxConns != AppMaxConns || cfg.MaxConnIdleTime != AppMaxConnIdleTime {
		t.Errorf("pooled node: %d conns idle %v, want %d, %v", cfg.MaxConns, cfg.MaxConnIdleTime, AppMaxConns, AppMaxConnIdleTime)
	}

	n.PoolDSN += "?pool_max_conns=7&default_query_exec_mode=exec&pool_max_conn_idle_time=5s"
	if cfg, err = AppPoolConfig(n); err != nil {
		t.Fatal(err)
	}
	if cfg.MaxConns != 7 || cfg.MaxConnIdleTime != 5*time.Second || cfg.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeExec {
		t.Errorf("the DSN's settings lost: %d conns idle %v mode %v", cfg.MaxConns, cfg.MaxConnIdleTime, cfg.ConnConfig.DefaultQueryExecMode)
	}

	n.PoolDSN = ""
	if cfg, err = AppPoolConfig(n); err != nil {
		t.Fatal(err)
	}
	if cfg.ConnConfig.Port != 5432 || cfg.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement || cfg.MaxConns != AppMaxConns {
		t.Errorf("node without a pooler: port %d mode %v conns %d", cfg.ConnConfig.Port, cfg.ConnConfig.DefaultQueryExecMode, cfg.MaxConns)
	}
	// The direct path is the DSN whatever the pooler, in pgx's defaults.
	n.PoolDSN = "postgres://app@db1:6432/app"
	if cfg, err = PoolConfig(n); err != nil {
		t.Fatal(err)
	}
	if cfg.ConnConfig.Port != 5432 || cfg.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		t.Errorf("direct path: port %d mode %v", cfg.ConnConfig.Port, cfg.ConnConfig.DefaultQueryExecMode)
	}
	// The application's escape hatch past the pooler: the DSN, pgx's
	// default mode, the application's sizes unless the DSN sets its own.
	n.DSN += "?pool_max_conns=3"
	if cfg, err = SessionPoolConfig(n); err != nil {
		t.Fatal(err)
	}
	if cfg.ConnConfig.Port != 5432 || cfg.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement || cfg.MaxConns != 3 || cfg.MaxConnIdleTime != AppMaxConnIdleTime {
		t.Errorf("session pool: port %d mode %v conns %d idle %v", cfg.ConnConfig.Port, cfg.ConnConfig.DefaultQueryExecMode, cfg.MaxConns, cfg.MaxConnIdleTime)
	}
}

// A connection says which program made it, unless its DSN or PGAPPNAME
// names one (libpq's rules: the DSN first, then the environment).
func TestApplicationName(t *testing.T) {
	t.Setenv("PGAPPNAME", "")
	for _, tc := range []struct {
		dsn, env, want string
	}{
		{"postgres://u@h/db", "", ApplicationName},
		{"postgres://u@h/db?application_name=billing", "", "billing"},
		{"postgres://u@h/db", "from-env", "from-env"},
		{"postgres://u@h/db?application_name=billing", "from-env", "billing"},
	} {
		t.Setenv("PGAPPNAME", tc.env)
		n := bucketmap.Node{ID: "pg1", DSN: tc.dsn}
		cc, err := ConnConfig(n)
		if err != nil {
			t.Fatal(err)
		}
		pc, err := PoolConfig(n)
		if err != nil {
			t.Fatal(err)
		}
		if got, pool := cc.RuntimeParams["application_name"], pc.ConnConfig.RuntimeParams["application_name"]; got != tc.want || pool != tc.want {
			t.Errorf("%s with PGAPPNAME=%q: application_name %q (pool %q), want %q", tc.dsn, tc.env, got, pool, tc.want)
		}
	}
	for args, want := range map[string]string{"/usr/bin/shardctl": "shardctl", "supervisor": "supervisor", "": "unknown", "/x/": "unknown"} {
		if got := programName([]string{args}); got != want {
			t.Errorf("programName(%q) = %q, want %q", args, got, want)
		}
	}
	if got := programName(nil); got != "unknown" {
		t.Errorf("programName(nil) = %q", got)
	}
}
