package devenv_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// quietLog drops go-zookeeper's reconnect lines.
type quietLog struct{}

func (quietLog) Printf(string, ...any) {}

// session dials the ensemble with dial (nil: plain TCP) and reports
// whether a session came within wait.
func session(t *testing.T, e *devenv.Env, dial zk.Dialer, wait time.Duration) (*zk.Conn, bool) {
	t.Helper()
	if dial == nil {
		dial = net.DialTimeout
	}
	c, _, err := zk.Connect(strings.Split(e.ZKConnect(), ","), 5*time.Second, zk.WithLogger(quietLog{}), zk.WithDialer(dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c.State() == zk.StateHasSession {
			return c, true
		}
	}
	return c, false
}

func dialAs(t *testing.T, f pki.Files) zk.Dialer {
	t.Helper()
	cfg, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	return pki.Dialer(cfg)
}

// With TLS the ensemble takes no plain client, no client of another CA,
// and tells identities apart by certificate; a Patroni group runs on it.
// PostgreSQL (the group pg1 and the plain node pg2) takes TCP over TLS
// only. In make test-faults (about 40 s on its own ensemble): make test
// had reached its 5-minute budget.
func TestFaultsTLSEnsemble(t *testing.T) {
	testenv.Faults(t)
	e := throwawayWith(t, devenv.Config{PGNodes: 2, HA: 2, HANodes: []int{1}, TLS: true})
	if err := e.Up(); err != nil {
		t.Fatal(err)
	}
	if st, ok := status(t, e); !ok {
		t.Fatalf("not healthy after up:\n%s", st)
	}

	// pgBackRest reaches the servers over their unix sockets (local
	// trust): TLS asks nothing more of it.
	t.Run("WAL archiving", func(t *testing.T) {
		nodeArchives(t, e, 1, 1)
		nodeArchives(t, e, 2, 1)
	})

	t.Run("plain client gets no session", func(t *testing.T) {
		if _, ok := session(t, e, nil, 3*time.Second); ok {
			t.Fatal("a plain TCP client got a session")
		}
		if out, err := devenv.FourLetterWord(strings.Split(e.ZKConnect(), ",")[0], "srvr", 2*time.Second); err == nil && strings.Contains(out, "Mode") {
			t.Fatalf("a plain four-letter word was answered: %q", out)
		}
	})

	// shardctl zk status's check: srvr answers over TLS to a certificate
	// of the CA, and not over plain TCP.
	t.Run("four-letter words over TLS", func(t *testing.T) {
		cs, err := zksession.ParseConnect(e.ZKConnect())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if st := zksession.Ensemble(ctx, cs, dialAs(t, e.TLSFiles("webhead"))); !st.Quorum || st.Serving != len(cs.Servers) {
			t.Fatalf("over TLS: %+v", st)
		}
		if st := zksession.Ensemble(ctx, cs, nil); st.Serving != 0 {
			t.Fatalf("plain srvr answered: %+v", st)
		}
		// cons and stat list every client's address and session id.
		for _, w := range []string{"cons", "stat", "wchs"} {
			if out, err := zksession.FourLetterVia(ctx, dialAs(t, e.TLSFiles("webhead")), cs.Servers[0], w); err == nil {
				t.Errorf("%s answered: %.200q", w, out)
			}
		}
	})

	t.Run("client of another CA gets no session", func(t *testing.T) {
		dir := t.TempDir()
		ca, err := pki.NewCA("rogue", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := ca.Issue(pki.Identity{Role: "admin", Host: "devenv"}, time.Hour) // the superuser's very name
		if err != nil {
			t.Fatal(err)
		}
		f := pki.FilesIn(dir, "rogue")
		f.CA = e.TLSFiles("").CA // it trusts the real servers; they must not trust it
		if err := leaf.Write(f.Cert, f.Key); err != nil {
			t.Fatal(err)
		}
		if _, ok := session(t, e, dialAs(t, f), 3*time.Second); ok {
			t.Fatal("a client certificate of another CA got a session")
		}
	})

	t.Run("identities are told apart", func(t *testing.T) {
		web, ok := session(t, e, dialAs(t, e.TLSFiles("webhead")), 10*time.Second)
		if !ok {
			t.Fatal("the web head identity got no session")
		}
		admin, ok := session(t, e, dialAs(t, e.TLSFiles("admin")), 10*time.Second)
		if !ok {
			t.Fatal("the admin identity got no session")
		}
		webDN := pki.Identity{Role: "webhead", Host: "web1"}.DN()
		acl := append([]zk.ACL{{Perms: zk.PermAll, Scheme: "x509", ID: webDN}}, zk.WorldACL(zk.PermRead)...)
		if _, err := web.Create("/tls-test", []byte("web"), 0, acl); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Set("/tls-test", []byte("admin"), -1); !errors.Is(err, zk.ErrNoAuth) {
			t.Fatalf("another identity set the web head's znode: %v", err)
		}
		if _, err := web.Set("/tls-test", []byte("web again"), -1); err != nil {
			t.Fatalf("the owner could not set its znode: %v", err)
		}
		got, _, err := admin.GetACL("/tls-test")
		if err != nil || len(got) != 2 || got[0].Scheme != "x509" || got[0].ID != webDN {
			t.Fatalf("ACL = %v, %v; want x509:%s first", got, err, webDN)
		}
	})

	// The attacks of issue 38 from a web head, and from another group's
	// db host: rewrite the config (archive_command runs as postgres;
	// synchronous_mode off), delete the leader key, ask for a failover,
	// delete or fake a member. ZooKeeper refuses each; the web head reads.
	t.Run("only the group's Patroni writes its records", func(t *testing.T) {
		for _, who := range []string{"webhead", "admin", "patroni-pg2"} {
			c, ok := session(t, e, dialAs(t, e.TLSFiles(who)), 10*time.Second)
			if !ok {
				t.Fatalf("%s got no session", who)
			}
			cfg, st, err := c.Get("/service/pg1/config")
			if who == "patroni-pg2" {
				if !errors.Is(err, zk.ErrNoAuth) {
					t.Errorf("%s read pg1's config: %v", who, err)
				}
			} else if err != nil || !strings.Contains(string(cfg), `"synchronous_mode":true`) {
				t.Fatalf("%s cannot read pg1's config: %q, %v", who, cfg, err)
			}
			bad := []byte(`{"synchronous_mode":false,"postgresql":{"parameters":{"archive_mode":"always","archive_command":"id > /tmp/owned"}}}`)
			version := int32(-1)
			if st != nil {
				version = st.Version
			}
			attacks := map[string]error{}
			_, attacks["set config"] = c.Set("/service/pg1/config", bad, version)
			attacks["delete leader"] = c.Delete("/service/pg1/leader", -1)
			_, attacks["create failover"] = c.Create("/service/pg1/failover", []byte(`{"leader":"pg1-m1"}`), 0, zk.WorldACL(zk.PermAll))
			attacks["delete member"] = c.Delete("/service/pg1/members/pg1-m2", -1)
			_, attacks["fake member"] = c.Create("/service/pg1/members/pg1-m9", []byte(`{"role":"replica"}`), zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
			attacks["delete sync"] = c.Delete("/service/pg1/sync", -1)
			_, attacks["create a group"] = c.Create("/service/pg7", nil, 0, zk.WorldACL(zk.PermAll))
			for what, err := range attacks {
				if !errors.Is(err, zk.ErrNoAuth) {
					t.Errorf("%s: %s = %v, want %v", who, what, err, zk.ErrNoAuth)
				}
			}
		}
		if st, ok := status(t, e); !ok {
			t.Fatalf("the group changed under the attacks:\n%s", st)
		}
	})

	// Patroni's REST API: PATCH /config (archive_command, synchronous_mode
	// off) and POST /restart need the operators' password as well as a
	// certificate of the CA; reading needs the certificate.
	t.Run("REST API", func(t *testing.T) {
		api := "https://127.0.0.1:" + strconv.Itoa(e.MemberAPIPort(1, 1))
		client := func(f *pki.Files) *http.Client {
			cfg := &tls.Config{}
			if f != nil {
				var err error
				if cfg, err = f.Config(); err != nil {
					t.Fatal(err)
				}
			} else {
				pool := x509.NewCertPool()
				b, _ := os.ReadFile(e.TLSFiles("").CA)
				pool.AppendCertsFromPEM(b)
				cfg.RootCAs = pool
			}
			return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		}
		do := func(c *http.Client, method, url, body, pw string) (int, string, error) {
			req, _ := http.NewRequest(method, url, strings.NewReader(body))
			if pw != "" {
				req.SetBasicAuth(devenv.PatroniAPIUser, pw)
			}
			resp, err := c.Do(req)
			if err != nil {
				return 0, "", err
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b), nil
		}
		bad := `{"synchronous_mode": false, "postgresql": {"parameters": {"archive_mode": "always", "archive_command": "id > /tmp/owned"}}}`
		web := e.TLSFiles("webhead")
		if code, _, err := do(http.DefaultClient, "PATCH", "http"+strings.TrimPrefix(api, "https")+"/config", bad, ""); err == nil && code < 300 {
			t.Errorf("plain HTTP PATCH /config: %d", code)
		}
		if _, _, err := do(client(nil), "GET", api+"/patroni", "", ""); err == nil {
			t.Error("a client without a certificate was answered")
		}
		if code, body, err := do(client(&web), "GET", api+"/patroni", "", ""); err != nil || code != 200 || !strings.Contains(body, `"role"`) {
			t.Errorf("the web head cannot read /patroni: %d %q %v", code, body, err)
		}
		for _, pw := range []string{"", "guess"} {
			for _, r := range [][2]string{{"PATCH", "/config"}, {"POST", "/restart"}, {"POST", "/switchover"}, {"POST", "/reinitialize"}} {
				if code, body, err := do(client(&web), r[0], api+r[1], bad, pw); err != nil || code != 401 {
					t.Errorf("web head %s %s with password %q: %d %q %v, want 401", r[0], r[1], pw, code, body, err)
				}
			}
		}
		pw, err := os.ReadFile(e.APIPasswordFile())
		if err != nil {
			t.Fatal(err)
		}
		admin := e.TLSFiles("admin")
		if code, body, err := do(client(&admin), "PATCH", api+"/config", `{"maximum_lag_on_failover": 16777216}`, strings.TrimSpace(string(pw))); err != nil || code != 200 {
			t.Errorf("the operator's PATCH /config with the password: %d %q %v", code, body, err)
		}
		if _, body, _ := do(client(&admin), "GET", api+"/config", "", ""); !strings.Contains(body, `"synchronous_mode": true`) && !strings.Contains(body, `"synchronous_mode":true`) {
			t.Errorf("synchronous_mode changed: %s", body)
		}
	})

	// shardvisor, as a web head over TLS, reads the group and finds its
	// records locked: no open ACL, no severe problem. (On a plain
	// environment the open records are a severe problem: topo's tests.)
	t.Run("shardvisor reads the locked group as sound", func(t *testing.T) {
		s, err := zksession.Open(zksession.Config{Connect: e.ZKConnect(), Dial: dialAs(t, e.TLSFiles("webhead"))})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := s.WaitConnected(ctx); err != nil {
			t.Fatal(err)
		}
		g, err := topo.ReadPatroni(ctx, s, devenv.PatroniNamespace, "pg1")
		if err != nil {
			t.Fatal(err)
		}
		if g.OpenACL {
			t.Error("the locked group's records read as open")
		}
		// #13's walk over Patroni's records (what `shardctl acl check`
		// adds to the cluster's): no znode anyone may write.
		holes, checked, err := topo.CheckPatroniACLs(ctx, s, []string{topo.PatroniDir(devenv.PatroniNamespace, "pg1")})
		if err != nil || len(holes) != 0 || checked < 5 {
			t.Errorf("Patroni's records: %d checked, holes %+v, %v; want several and none", checked, holes, err)
		}
		for _, p := range g.Problems() {
			if p.Severe {
				t.Errorf("severe problem: %s", p.Message)
			}
		}
	})

	t.Run("PostgreSQL over TLS only", func(t *testing.T) { pgOverTLSOnly(t, e) })

	// Each server's PgBouncer: TLS only, with the server's certificate;
	// the plain node's serves real clients over it, the group's pool DSN
	// (every member's pooler) reaches the primary.
	t.Run("PgBouncer over TLS only", func(t *testing.T) {
		poolerOverTLSOnly(t, e, map[string]int{"pg1-m1": e.MemberPoolPort(1, 1), "pg1-m2": e.MemberPoolPort(1, 2), "pg2": e.PoolPort(2)})
		poolerServes(t, e, 2)
		var recovery bool
		c, err := pgx.Connect(t.Context(), withParam(e.NodePoolDSN(1), "default_query_exec_mode=cache_describe"))
		if err != nil {
			t.Fatalf("pg1's pool DSN: %v", err)
		}
		defer c.Close(context.Background())
		if err := c.QueryRow(t.Context(), "SELECT pg_is_in_recovery()").Scan(&recovery); err != nil || recovery {
			t.Errorf("pg1's pool DSN reached a standby (%v)", err)
		}
		// Each member's Patroni callback has its pooler reconnect over
		// TLS, as the postgres user's libpq (HOME: the member's
		// directory, the CA in ~/.postgresql) logging in as the admin.
		primary, _, _, _ := e.Primary(1)
		for m := 1; m <= 2; m++ {
			role := "replica"
			if primary == devenv.MemberName(1, m) {
				role = "master"
			}
			cmd := exec.Command(filepath.Join(e.MemberDir(1, m), "pgbouncer-role-change"), "on_role_change", role, "pg1")
			cmd.Env = append(os.Environ(), "HOME="+e.MemberDir(1, m))
			if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
				t.Errorf("pg1-m%d's pgbouncer-role-change %s: %v\n%s", m, role, err, out)
			}
			if b, _ := os.ReadFile(filepath.Join(e.MemberDir(1, m), "pgbouncer.log")); !strings.Contains(string(b), "RECONNECT command issued") {
				t.Errorf("pg1-m%d's pooler was not told to reconnect:\n%s", m, b)
			}
		}
	})

	t.Run("moves' streams log in by certificate", func(t *testing.T) { streamsByCertificate(t, e, 1, 2) })

	t.Run("server certificates rotate by reload", func(t *testing.T) { certsRotateByReload(t, e, 1, 2) })

	t.Run("Patroni reaches ZooKeeper over TLS", func(t *testing.T) {
		if _, port, ok, err := e.Primary(1); err != nil || !ok || port == 0 {
			t.Fatalf("no primary: %v", err)
		}
		addr := net.JoinHostPort("127.0.0.1", "7811")
		if _, err := net.DialTimeout("tcp", addr, time.Second); err != nil {
			t.Fatalf("the TLS client port is not listening: %v", err)
		}
	})

}

// up in the plain mode restarts the group, the plain node and the whole
// ensemble plain and opens the group's records to a plain Patroni; up
// with TLS again locks them anew, the records the plain run kept
// included, and PostgreSQL takes TCP over TLS only again. Two whole
// restarts: make test-faults runs it.
func TestFaultsTLSModeSwitch(t *testing.T) {
	testenv.Faults(t)
	e := throwawayWith(t, devenv.Config{PGNodes: 2, HA: 2, HANodes: []int{1}, TLS: true})
	plainPG := func(port int) error {
		return testenv.Exec(t.Context(), "postgres://postgres:"+e.Password()+"@127.0.0.1:"+strconv.Itoa(port)+"/postgres?sslmode=disable&connect_timeout=5", "SELECT 1")
	}
	if err := e.Up(); err != nil {
		t.Fatal(err)
	}
	{
		// A whole restart each way, beside other work: a TLS ensemble's
		// quorum handshakes get slow on a loaded machine (docs/security.md).
		cfg := e.Config()
		cfg.TLS, cfg.Timeout = false, 5*time.Minute
		plain := devenv.New(cfg)
		if err := plain.Up(); err != nil {
			t.Fatal(err)
		}
		if tls, ok := plain.RunningTLS(); !ok || tls {
			t.Fatalf("after a plain up: running %v, TLS %v", ok, tls)
		}
		// The group's synchronous standby comes back a moment after up.
		testenv.WaitFor(t, 2*time.Minute, func() bool { _, ok := status(t, plain); return ok }, "healthy after a plain up")
		c, ok := session(t, plain, nil, 10*time.Second)
		if !ok {
			t.Fatal("a plain client got no session after a plain up")
		}
		for _, p := range []string{"/service", "/service/pg1", "/service/pg1/config"} {
			if acl, _, err := c.GetACL(p); err != nil || len(acl) != 1 || acl[0] != zk.WorldACL(zk.PermAll)[0] {
				t.Errorf("plain: %s ACL = %v, %v; want anyone ALL", p, acl, err)
			}
		}
		for _, port := range []int{plain.MemberPort(1, 1), plain.MemberPort(1, 2), plain.PGPort(2)} {
			if err := plainPG(port); err != nil {
				t.Errorf("plain: a plain TCP client of port %d: %v", port, err)
			}
		}

		cfg.TLS = true
		if err := devenv.New(cfg).Up(); err != nil {
			t.Fatal(err)
		}
		if tls, ok := e.RunningTLS(); !ok || !tls {
			t.Fatalf("after a TLS up: running %v, TLS %v", ok, tls)
		}
		// The group's synchronous standby comes back a moment after up.
		testenv.WaitFor(t, 2*time.Minute, func() bool { _, ok := status(t, e); return ok }, "healthy after a TLS up")
		if _, ok := session(t, e, nil, 3*time.Second); ok {
			t.Fatal("a plain client got a session after a TLS up")
		}
		pgOverTLSOnly(t, e)
		web, ok := session(t, e, dialAs(t, e.TLSFiles("web2")), 10*time.Second)
		if !ok {
			t.Fatal("web head 2 got no session")
		}
		if _, st, err := web.Get("/service/pg1/config"); err != nil {
			t.Errorf("web head 2 cannot read pg1's config: %v", err)
		} else if _, err := web.Set("/service/pg1/config", []byte(`{"synchronous_mode":false}`), st.Version); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("web head 2 set pg1's config after the switch: %v, want %v", err, zk.ErrNoAuth)
		}
	}
}

// pgOverTLSOnly: every PostgreSQL server of e (group pg1's members, plain
// node pg2) refuses a plain TCP client and one that verifies it against
// another CA, and serves over TLS a client that verifies it against the
// environment's; the DSNs devenv prints work; the group's standby
// streams from its primary over TLS.
func pgOverTLSOnly(t *testing.T, e *devenv.Env) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rogue := rogueCA(t)
	servers := map[string]int{"pg1-m1": e.MemberPort(1, 1), "pg1-m2": e.MemberPort(1, 2), "pg2": e.PGPort(2)}
	for name, port := range servers {
		dsn := func(ssl string) string {
			return "postgres://postgres:" + e.Password() + "@127.0.0.1:" + strconv.Itoa(port) + "/postgres?connect_timeout=5&" + ssl
		}
		var pe *pgconn.PgError
		if err := testenv.Exec(ctx, dsn("sslmode=disable"), "SELECT 1"); !errors.As(err, &pe) || pe.Code != "28000" {
			t.Errorf("%s: a plain TCP client: %v, want refused by pg_hba (28000)", name, err)
		}
		if err := testenv.Exec(ctx, dsn("sslmode=verify-full&sslrootcert="+rogue), "SELECT 1"); err == nil || errors.As(err, &pe) {
			t.Errorf("%s: a client trusting another CA: %v, want its TLS handshake to fail", name, err)
		}
		c, err := pgx.Connect(ctx, dsn("sslmode=verify-full&sslrootcert="+e.TLSFiles("").CA))
		if err != nil {
			t.Errorf("%s: verify-full with the environment's CA: %v", name, err)
			continue
		}
		var ssl bool
		if err := c.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
			t.Errorf("%s: pg_stat_ssl says ssl %v (%v)", name, ssl, err)
		}
		c.Close(ctx)
		if fi, err := os.Stat(e.TLSFiles(name).Key); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: key file %v %v, want mode 0600", name, fi, err)
		}
	}
	for i := 1; i <= 2; i++ {
		if err := testenv.Exec(ctx, e.NodeDSN(i), "SELECT 1"); err != nil {
			t.Errorf("pg%d's DSN %s: %v", i, e.NodeDSN(i), err)
		}
	}
	// The standby's walreceiver connects over TCP as Patroni's replication
	// user: its walsender on the primary.
	_, port, ok, err := e.Primary(1)
	if err != nil || !ok {
		t.Fatalf("pg1: no primary: %v", err)
	}
	c, err := pgx.Connect(ctx, "postgres://postgres:"+e.Password()+"@127.0.0.1:"+strconv.Itoa(port)+"/postgres?"+e.PGSSLParams())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	// A move's subscription: the subscriber's server connects to the
	// publisher with the DSN's TLS settings (its libpq, as the postgres
	// user). Each way between the plain node and the group's primary.
	plain, err := pgx.Connect(ctx, e.NodeDSN(2))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)
	for _, w := range []struct {
		sub     *pgx.Conn
		pubPort int
	}{{plain, port}, {c, e.PGPort(2)}} {
		conninfo := "host=127.0.0.1 port=" + strconv.Itoa(w.pubPort) + " dbname=postgres user=postgres password=" + e.Password() +
			" sslmode=verify-full sslrootcert=" + e.TLSFiles("").CA
		if _, err := w.sub.Exec(ctx, "CREATE SUBSCRIPTION tls_probe CONNECTION '"+conninfo+"' PUBLICATION tls_probe WITH (create_slot = false, enabled = false, slot_name = NONE)"); err != nil {
			t.Errorf("a subscription to port %d over TLS: %v", w.pubPort, err)
			continue
		}
		if _, err := w.sub.Exec(ctx, "DROP SUBSCRIPTION tls_probe"); err != nil {
			t.Error(err)
		}
	}
	var streams, overTLS int
	testenv.WaitFor(t, time.Minute, func() bool {
		err := c.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid)`).Scan(&streams, &overTLS)
		return err == nil && streams > 0
	}, "the standby streaming from the primary")
	if overTLS != streams {
		t.Errorf("pg1's primary: %d of %d replication connections over TLS", overTLS, streams)
	}
}

// rogueCA writes the certificate of a CA the environment does not trust
// and returns its path: a client that verifies against it must refuse
// the environment's servers.
func rogueCA(t *testing.T) string {
	t.Helper()
	rogue := filepath.Join(t.TempDir(), "rogue-ca.crt")
	ca, err := pki.NewCA("rogue", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Write(rogue, filepath.Join(filepath.Dir(rogue), "rogue-ca.key")); err != nil {
		t.Fatal(err)
	}
	return rogue
}
