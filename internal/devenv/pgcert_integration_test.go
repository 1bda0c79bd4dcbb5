package devenv_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// streamsByCertificate: a move's subscription (the mover's conninfo,
// dbnode.ConnString of a node with a stream user, and its options) from
// plain node `plain` to group `group`'s primary and back logs in by the
// subscribing server's client certificate: no password in its catalog,
// rows stream over TLS, and the walsender's client is the subscriber's
// certificate. The stream user is refused without a certificate, with one
// of another CA, and with one of the CA that is no db server's.
func streamsByCertificate(t *testing.T, e *devenv.Env, group, plain int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, _, ok, err := e.Primary(group)
	if err != nil || !ok {
		t.Fatalf("pg%d: no primary: %v", group, err)
	}
	connect := func(i int) *pgx.Conn {
		c, err := pgx.Connect(ctx, e.NodeDSN(i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	conns := map[int]*pgx.Conn{group: connect(group), plain: connect(plain)}
	names := map[int]string{group: primary, plain: "pg" + strconv.Itoa(plain)}
	for _, w := range []struct{ pub, sub int }{{group, plain}, {plain, group}} {
		pub, sub := conns[w.pub], conns[w.sub]
		name := "certstream_" + strconv.Itoa(w.pub) + "_" + strconv.Itoa(w.sub)
		for _, c := range []*pgx.Conn{pub, sub} {
			if _, err := c.Exec(ctx, "DROP TABLE IF EXISTS "+name+"; CREATE TABLE "+name+" (id int PRIMARY KEY, v text)"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pub.Exec(ctx, "CREATE PUBLICATION "+name+" FOR TABLE "+name); err != nil {
			t.Fatal(err)
		}
		if _, err := pub.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", name); err != nil {
			t.Fatal(err)
		}
		node := bucketmap.Node{ID: bucketmap.NodeID("pg" + strconv.Itoa(w.pub)), DSN: e.NodeDSN(w.pub), StreamUser: devenv.StreamUser}
		conninfo, err := dbnode.ConnString(node)
		if err != nil {
			t.Fatal(err)
		}
		// As the mover creates it (migrate/pg.go createSubscription).
		if _, err := sub.Exec(ctx, "CREATE SUBSCRIPTION "+name+" CONNECTION '"+strings.ReplaceAll(conninfo, "'", "''")+"' PUBLICATION "+name+
			" WITH (enabled = false, copy_data = false, create_slot = false, slot_name = "+name+", binary = true, disable_on_error = true)"); err != nil {
			t.Fatalf("pg%d subscribing to pg%d: %v", w.sub, w.pub, err)
		}
		t.Cleanup(func() {
			ctx := context.Background()
			_, _ = sub.Exec(ctx, "DROP SUBSCRIPTION IF EXISTS "+name)
			_, _ = pub.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", name)
			_, _ = pub.Exec(ctx, "DROP PUBLICATION IF EXISTS "+name)
			_, _ = pub.Exec(ctx, "DROP TABLE IF EXISTS "+name)
			_, _ = sub.Exec(ctx, "DROP TABLE IF EXISTS "+name)
		})
		var stored string
		if err := sub.QueryRow(ctx, "SELECT subconninfo FROM pg_subscription WHERE subname = $1", name).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(stored, "password") || strings.Contains(stored, e.Password()) {
			t.Errorf("pg%d's catalog holds a password: subconninfo %q", w.sub, stored)
		}
		if !strings.Contains(stored, "sslmode='verify-full'") {
			t.Errorf("subconninfo %q does not verify the server", stored)
		}
		if _, err := sub.Exec(ctx, "ALTER SUBSCRIPTION "+name+" ENABLE"); err != nil {
			t.Fatal(err)
		}
		if _, err := pub.Exec(ctx, "INSERT INTO "+name+" VALUES (1, 'over TLS')"); err != nil {
			t.Fatal(err)
		}
		var v string
		testenv.WaitFor(t, time.Minute, func() bool {
			return sub.QueryRow(ctx, "SELECT v FROM "+name+" WHERE id = 1").Scan(&v) == nil
		}, "pg"+strconv.Itoa(w.sub)+" to receive the row from pg"+strconv.Itoa(w.pub))
		var ssl bool
		var user, dn string
		if err := pub.QueryRow(ctx, `SELECT s.ssl, r.usename, coalesce(s.client_dn, '') FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid)
			WHERE r.application_name = $1`, name).Scan(&ssl, &user, &dn); err != nil {
			t.Fatalf("pg%d: the subscription's walsender: %v", w.pub, err)
		}
		if !ssl || user != devenv.StreamUser || !strings.HasSuffix(dn, "CN="+names[w.sub]) {
			t.Errorf("pg%d's walsender for pg%d: ssl %v, user %q, client %q; want TLS, %s, CN=%s", w.pub, w.sub, ssl, user, dn, devenv.StreamUser, names[w.sub])
		}
	}

	// Who else tries the stream user's way in.
	dir := t.TempDir()
	rogue, err := pki.NewCA("rogue", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fake, err := rogue.Issue(pki.Identity{Role: "postgres", Host: "pg2"}, time.Hour) // a db server's very name
	if err != nil {
		t.Fatal(err)
	}
	rf := pki.FilesIn(dir, "fake")
	if err := fake.Write(rf.Cert, rf.Key); err != nil {
		t.Fatal(err)
	}
	web, err := e.IssueIdentity("certstream-web", pki.Identity{Role: "webhead", Host: "web1"})
	if err != nil {
		t.Fatal(err)
	}
	ca := e.TLSFiles("").CA
	for _, port := range []int{e.MemberPort(group, 1), e.MemberPort(group, 2), e.PGPort(plain)} {
		base := "host=127.0.0.1 port=" + strconv.Itoa(port) + " dbname=postgres user=" + devenv.StreamUser + " connect_timeout=5 sslmode=verify-full sslrootcert=" + ca
		var pe *pgconn.PgError
		if err := testenv.Exec(ctx, base, "SELECT 1"); !errors.As(err, &pe) || pe.Code != "28000" {
			t.Errorf("port %d: the stream user without a certificate: %v, want refused (28000)", port, err)
		}
		// Go's client sends no certificate the server's request does not
		// name the CA of (refused by pg_hba); libpq sends it (the
		// handshake fails). Refused either way.
		if err := testenv.Exec(ctx, base+" sslcert="+rf.Cert+" sslkey="+rf.Key, "SELECT 1"); err == nil {
			t.Errorf("port %d: the stream user with a certificate of another CA got in", port)
		}
		if err := testenv.Exec(ctx, base+" sslcert="+web.Cert+" sslkey="+web.Key, "SELECT 1"); !errors.As(err, &pe) || pe.Code != "28000" {
			t.Errorf("port %d: the stream user with a web head's certificate: %v, want refused by the map (28000)", port, err)
		}
		// Group pgI's Patroni has CN pgI too, with OU patroni: the map
		// matches the whole subject, and refuses it.
		pat := e.TLSFiles("patroni-pg" + strconv.Itoa(group))
		if err := testenv.Exec(ctx, base+" sslcert="+pat.Cert+" sslkey="+pat.Key, "SELECT 1"); !errors.As(err, &pe) || pe.Code != "28000" {
			t.Errorf("port %d: the stream user with Patroni's certificate: %v, want refused by the map (28000)", port, err)
		}
		if err := testenv.Exec(ctx, base+" sslcert="+e.TLSFiles(names[plain]).Cert+" sslkey="+e.TLSFiles(names[plain]).Key, "SELECT 1"); err != nil {
			t.Errorf("port %d: the stream user with %s's certificate: %v", port, names[plain], err)
		}
	}
}

// serverSerial is the serial of the certificate the server of c showed.
func serverSerial(t *testing.T, c *pgx.Conn) string {
	t.Helper()
	tc, ok := c.PgConn().Conn().(*tls.Conn)
	if !ok {
		t.Fatalf("not a TLS connection: %T", c.PgConn().Conn())
	}
	return tc.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// certsRotateByReload: RotatePGCerts gives every server (plain node
// plain, group group's members) and its PgBouncer a new certificate
// without a restart: an open connection keeps working, a new one sees the
// new serial, and the moves' streams (client certificates, the same
// files) still log in.
func certsRotateByReload(t *testing.T, e *devenv.Env, group, plain int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ports := []int{e.PGPort(plain), e.MemberPort(group, 1), e.MemberPort(group, 2),
		e.PoolPort(plain), e.MemberPoolPort(group, 1), e.MemberPoolPort(group, 2)}
	// No named prepared statements: half the ports are transaction
	// poolers.
	dsn := func(port int) string {
		return "postgres://postgres:" + e.Password() + "@127.0.0.1:" + strconv.Itoa(port) + "/postgres?" + e.PGSSLParams() + "&default_query_exec_mode=cache_describe"
	}
	open := map[int]*pgx.Conn{}
	before := map[int]string{}
	starts := map[int]string{}
	for _, p := range ports {
		c, err := pgx.Connect(ctx, dsn(p))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		open[p], before[p], starts[p] = c, serverSerial(t, c), started(t, c)
	}
	if err := e.RotatePGCerts(); err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if _, err := open[p].Exec(ctx, "SELECT 1"); err != nil {
			t.Errorf("port %d: the connection open across the rotation: %v", p, err)
		}
		c, err := pgx.Connect(ctx, dsn(p))
		if err != nil {
			t.Errorf("port %d: a new connection after the rotation: %v", p, err)
			continue
		}
		if s := serverSerial(t, c); s == before[p] {
			t.Errorf("port %d: a new connection still sees serial %s", p, s)
		}
		if st := started(t, c); st != starts[p] {
			t.Errorf("port %d: the server restarted (at %s, was up since %s)", p, st, starts[p])
		}
		c.Close(ctx)
	}
	streamsByCertificate(t, e, group, plain)
}

// started is when c's server's postmaster started: a restart changes it.
func started(t *testing.T, c *pgx.Conn) string {
	t.Helper()
	var start string
	if err := c.QueryRow(context.Background(), "SELECT pg_postmaster_start_time()::text").Scan(&start); err != nil {
		t.Fatal(err)
	}
	return start
}
