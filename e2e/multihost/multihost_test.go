package multihost

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/hosts"
	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// TestFaultsAcrossHosts runs the whole system on ten hosts over TLS and
// reads the wire: writes under load through two web heads (supervisor,
// notes workers, and web1's router sidecar on HTTPS), a move and its
// rollback, a rebalance (the workers reload the map in place), a Patroni
// failover by SIGKILL of a primary's host, a primary cut from ZooKeeper by
// packet filtering (failsafe mode keeps it), a schema change and GC, then
// every certificate and the CA rotated under a fresh load. Then: every
// acknowledged write is on its owner; the rotation failed no request and
// restarted no worker; the capture of the bridge holds no marker written
// into rows, no password, no seed, no secret; every TCP stream between
// hosts started with TLS (or PostgreSQL's SSLRequest, then TLS); and a
// plain client and one of another CA are refused by every server.
func TestFaultsAcrossHosts(t *testing.T) {
	testenv.Faults(t)
	if os.Getenv(insideEnv) == "" {
		t.Skip("needs hosts (root, iproute2, nftables, tcpdump):", hosts.Available())
	}
	c, capt := newCluster(t)
	pw := c.env.Password()

	// The cluster: group pg1 first, then pg2; the notes table.
	c.shardctl("init", "--level", "4", "--random-seed", "--password", "file:"+c.env.PasswordFile(), "--x509-admin",
		"--node", "pg1="+c.nodeDSN(1))
	c.shardctl("schema", "apply", filepath.Join(repoRoot(), "examples/notes/schema/001-notes.sql"))
	c.shardctl("table", "add", "app.notes", "--key", "bkey")
	c.shardctl("node", "prepare", "pg1")
	c.shardctl("node", "add", "pg2", c.nodeDSN(2), "--password", "file:"+c.env.PasswordFile(), "--patroni-scope", "pg2")
	c.shardctl("node", "prepare", "pg2")

	// Two web heads, each a supervisor of the notes app on its own
	// certificate (ZooKeeper and its admin endpoints, beyond loopback:
	// HTTPS with client certificates), and web1's router sidecar.
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	secretFile := filepath.Join(c.dir, "peer-secret")
	if err := os.WriteFile(secretFile, []byte(hex.EncodeToString(secret)), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := c.env.TLSFiles("").CA
	for _, web := range []string{"web1", "web2"} {
		c.shardctl("pool", "set", "notes-"+web, "--file", c.writePool("pool-"+web, 2))
		f := c.env.TLSFiles(web)
		c.start(web, web, "supervisor", "--pool", "notes-"+web, "--member", web,
			"--admin", fmt.Sprintf("%s:%d", c.net.Host(web).Addr, adminPort), "--state-dir", filepath.Join(c.dir, web+"-supervisor"),
			"--peer-secret-file", secretFile, "--peer-refresh", "2s",
			"--admin-tls-ca", ca, "--admin-tls-cert", f.Cert, "--admin-tls-key", f.Key)
	}
	w1 := c.env.TLSFiles("web1")
	c.start("web1", "web1", "router", "--listen", fmt.Sprintf("%s:%d", c.net.Host("web1").Addr, routerPort),
		"--tls-ca", ca, "--tls-cert", w1.Cert, "--tls-key", w1.Key)
	op := c.httpOn("op", c.adminTLS())
	routerURL := fmt.Sprintf("https://%s:%d", c.net.Host("web1").Addr, routerPort)
	waitOK(t, op, routerURL+"/readyz", 60*time.Second)
	for _, web := range []string{"web1", "web2"} {
		waitOK(t, c.httpOn(web, nil), fmt.Sprintf("http://127.0.0.1:%d/healthz", appPort), 90*time.Second)
	}

	// Markers: a note per user whose body no stream may carry in clear. The
	// rows cross hosts in the app's writes, the standbys' replication, the
	// moves' copies and streams.
	marker := "wirecheck-" + hex.EncodeToString(secret[:6])
	app1 := c.httpOn("web1", nil)
	for i := range 40 {
		body, _ := json.Marshal(map[string]string{"body": fmt.Sprintf("%s-%d", marker, i)})
		res, err := app1.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/users/marked-%d/notes", appPort, i), "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode/100 != 2 {
			t.Fatalf("marker note %d: %s", i, res.Status)
		}
	}

	// Load on both web heads, from their own hosts (the load balancer's
	// traffic stays on the host here: it is the application's, in clear
	// by design, and not shardvisor's to encrypt).
	loads := c.startLoad("faults")
	time.Sleep(3 * time.Second) // deliberate: the load runs before the first change
	spawns := func() float64 {
		var s float64
		for _, web := range []string{"web1", "web2"} {
			v, err := metric(op, fmt.Sprintf("https://%s:%d/metrics", c.net.Host(web).Addr, adminPort), "shardvisor_supervisor_worker_spawns_total")
			if err != nil {
				t.Fatal(err)
			}
			s += v
		}
		return s
	}
	spawnsBefore := spawns()
	if spawnsBefore == 0 {
		t.Fatal("no worker spawn counted: the metric is not the supervisors'")
	}

	// A move of a marked user's bucket with a rollback window, and its
	// rollback: the copy, the catch-up stream and the reverse stream cross
	// between the groups' primaries.
	bucket := strings.Fields(c.shardctl("hash", "marked-0"))[1]
	var mv struct {
		ID string `json:"id"`
	}
	out := c.shardctl("move", bucket, "--to", "pg2", "--window", "10m", "--json")
	if err := json.Unmarshal([]byte(out), &mv); err != nil || mv.ID == "" {
		t.Fatalf("move --json: %v\n%s", err, out)
	}
	t.Logf("moved bucket %s to pg2 (%s); rolling back", bucket, mv.ID)
	c.shardctl("move", "rollback", mv.ID)

	// A rebalance: half the buckets to pg2; the workers reload the map in
	// place.
	c.shardctl("rebalance", "--json")

	// A failover: pg1's primary host dies (its Patroni and PostgreSQL,
	// SIGKILL); the synchronous standby takes over.
	killed, err := c.env.PGKill(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed pg1's primary %s", killed.Member)
	waitNewPrimary(t, c, 1, killed.Member)

	// A primary cut from ZooKeeper by packet filtering between its host and
	// the three ZooKeeper hosts. With failsafe mode (the groups share the
	// fleet's ensemble) it stays primary while it reaches every member, and
	// nothing is promoted: writes go on through it, past the ttl.
	p2, _, ok, err := c.env.Primary(2)
	if err != nil || !ok {
		t.Fatalf("pg2's primary: %q %v %v", p2, ok, err)
	}
	zks := []*hosts.Host{c.net.Host("zk1"), c.net.Host("zk2"), c.net.Host("zk3")}
	if err := hosts.Cut(c.net.Host(p2), zks...); err != nil {
		t.Fatal(err)
	}
	// The cut holds: from p2's host ZooKeeper does not answer, and the
	// leader key that p2's session held expires.
	for _, z := range zks {
		if err := c.net.Host(p2).Do(func() error {
			conn, err := net.DialTimeout("tcp", fmt.Sprintf("%s:%d", z.Addr, zkPortBase), time.Second)
			if err == nil {
				conn.Close()
				return fmt.Errorf("%s reached %s through the cut", p2, z.Name)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		if name, _, ok, _ := c.env.Primary(2); !ok || name != p2 {
			t.Fatalf("pg2: primary %q (ok %v) while %s was cut from ZooKeeper only: failsafe mode keeps it", name, ok, p2)
		}
		if err := probeWrite(c, 2); err != nil {
			t.Fatalf("pg2: a write through %s, cut from ZooKeeper only: %v", p2, err)
		}
	}
	t.Logf("pg2: %s cut from ZooKeeper stayed primary and took writes for 20 s (failsafe mode)", p2)
	if err := hosts.Heal(c.net.Host(p2), zks...); err != nil {
		t.Fatal(err)
	}
	// Not cut from its standby as well here: Patroni 3.0.2 then demotes
	// twice at once ("AsyncExecutor is busy, demoting from the main
	// thread"), starts two postmasters, loses track of one, and the old
	// primary does not rejoin by itself (docs/failover.md, "A primary cut
	// from ZooKeeper and its standby").
	// The killed member back (its host "restarted"): both groups whole.
	if err := c.env.Up(); err != nil {
		t.Fatal(err)
	}

	// A schema change across both groups, then GC of what moved.
	schemaFile := filepath.Join(c.dir, "002-tag.sql")
	if err := os.WriteFile(schemaFile, []byte("ALTER TABLE app.notes ADD COLUMN tag text;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.shardctl("schema", "apply", schemaFile)
	testenv.WaitFor(t, 2*time.Minute, func() bool {
		return c.cmd("admin", "shardctl", "gc", "--grace", "0s", "--dry-run").Run() == nil
	}, "a GC dry run with nothing uncertain")
	c.shardctl("gc", "--grace", "0s")

	// The load's outcome: nothing acknowledged lost (a request may fail
	// while a group has no primary: it was not acknowledged).
	c.stopLoad(loads, false)
	if s := spawns(); s != spawnsBefore {
		t.Errorf("workers spawned during the faults: %v -> %v (reload mode: the map reaches them in place)", spawnsBefore, s)
	}

	// Every certificate rotated, with a new CA, under a fresh load: no
	// request fails and no worker restarts. The servers reload (ZooKeeper
	// restarts one at a time: 3.8 cannot reload its client port); the
	// supervisors, workers, the sidecar and shardctl read their files
	// again at each new connection.
	spawnsBefore = spawns()
	loads = c.startLoad("rotation")
	time.Sleep(3 * time.Second) // deliberate: the load runs before the rotation
	rotStart := time.Now()
	if err := c.env.RotateTLS(true); err != nil {
		t.Fatal(err)
	}
	t.Logf("rotated every certificate and the CA in %s", time.Since(rotStart).Round(100*time.Millisecond))
	op = c.httpOn("op", c.adminTLS()) // the operator's new certificate, on new connections
	newCA, err := os.ReadFile(c.env.TLSFiles("").CA)
	if err != nil {
		t.Fatal(err)
	}
	// The sidecar and the supervisors' admin endpoints show a certificate
	// of the new CA to a new connection within 60 s.
	for _, srv := range []string{fmt.Sprintf("%s:%d", c.net.Host("web1").Addr, routerPort),
		fmt.Sprintf("%s:%d", c.net.Host("web1").Addr, adminPort), fmt.Sprintf("%s:%d", c.net.Host("web2").Addr, adminPort)} {
		waitNewIssuer(t, c, srv, newCA, rotStart)
	}
	time.Sleep(5 * time.Second) // deliberate: the load goes on after the rotation, on new connections
	c.stopLoad(loads, true)
	c.shardctl("status") // the operator, on the new certificates
	if s := spawns(); s != spawnsBefore {
		t.Errorf("workers spawned during the rotation: %v -> %v", spawnsBefore, s)
	}

	// The wire check, of everything above (the refusals below are plain
	// on purpose: they come after the capture).
	tail, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	refusals(t, c)
	t.Log(tail)
	seed := clusterSeed(t, c)
	apiPW, _ := os.ReadFile(c.env.APIPasswordFile())
	secrets := map[string][]byte{
		"marker":             []byte(marker),
		"postgres password":  []byte(pw),
		"keystream seed":     []byte(seed),
		"patroni api secret": bytes.TrimSpace(apiPW),
		"peer secret":        []byte(hex.EncodeToString(secret)),
	}
	rep, err := hosts.Analyze(capt.File, secrets)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, h := range c.net.Hosts() {
		names[h.Addr] = h.Name
	}
	for _, l := range rep.ByPort(names) {
		t.Log(l)
	}
	t.Logf("wire check: %d packets, %d TCP streams between hosts: %d TLS, %d SSLRequest then TLS, %d SSLRequest then closed, %d without a byte (refused or dropped connects); secrets found: %v",
		rep.Packets, len(rep.Streams), rep.Count(hosts.StartTLS), rep.Count(hosts.StartPGSSL), rep.Count(hosts.StartPGSSLOnly), rep.Count(hosts.StartEmpty), rep.Found)
	if !regexp.MustCompile(`(?m)^\s*0 packets dropped by kernel`).MatchString(tail) {
		t.Errorf("the capture lost packets: %s", tail)
	}
	for name, n := range rep.Found {
		if n != 0 {
			t.Errorf("%s found %d times on the wire", name, n)
		}
	}
	for _, s := range rep.Bad() {
		t.Errorf("a stream between hosts did not start with TLS: %s", s)
	}
	if rep.Unparsed != 0 {
		t.Errorf("%d captured frames were not IPv4 TCP: no stream holds them", rep.Unparsed)
	}
	// Every kind of connection between hosts was seen (a check that read
	// nothing would pass): name -> server name:port prefixes.
	seen := map[string]bool{}
	for _, l := range rep.ByPort(names) {
		f := strings.Fields(l)
		from, to := f[1], strings.Split(f[3], ":")[0]
		seen[kind(from)+"->"+kind(to)+" "+f[4]] = true
	}
	for _, want := range []string{
		"web->zk tls", "op->zk tls", "zk->zk tls", "pg->zk tls", // ZooKeeper clients and the quorum
		"web->pg pg-sslrequest-tls", "op->pg pg-sslrequest-tls", // the workers', the operator's
		"pg->pg pg-sslrequest-tls",                // standbys and the moves' streams
		"op->pg tls", "pg->pg tls", "op->web tls", // Patroni's REST API, the admin endpoints and the sidecar
	} {
		if !seen[want] {
			t.Errorf("no %s stream in the capture (seen: %v)", want, seen)
		}
	}
}

// startLoad starts the notes load on both web heads, from their hosts.
func (c *cluster) startLoad(phase string) []*proc {
	var loads []*proc
	for _, web := range []string{"web1", "web2"} {
		loads = append(loads, c.start(web, web, "loadgen", "run", "--url", fmt.Sprintf("http://127.0.0.1:%d", appPort),
			"--users", "60", "--concurrency", "4", "--rate", "150", "--status-every", "0", "--prefix", web+"-"+phase,
			"--failures", filepath.Join(c.dir, web+"-"+phase+"-failures.jsonl"),
			"--ledger", filepath.Join(c.dir, web+"-"+phase+"-ledger.jsonl"), "--summary", filepath.Join(c.dir, web+"-"+phase+"-load.json")))
	}
	return loads
}

// stopLoad stops the loads and checks that every acknowledged write is on
// its owner (and nowhere else); strict: and that no request failed.
func (c *cluster) stopLoad(loads []*proc, strict bool) {
	t := c.t
	t.Helper()
	for i, l := range loads {
		_ = l.Process.Signal(syscall.SIGTERM)
		testenv.Receive(t, l.exited, 60*time.Second, "the load generator to exit")
		args := l.Args
		ledger, summary := args[len(args)-3], args[len(args)-1]
		var sum struct {
			Requests, Failed int64
			Writes           int64            `json:"acknowledged_writes"`
			Errors           map[string]int64 `json:"errors"`
			LastError        string           `json:"last_error"`
		}
		b, _ := os.ReadFile(summary)
		if err := json.Unmarshal(b, &sum); err != nil {
			t.Fatalf("load summary %s: %v %s", summary, err, b)
		}
		web := []string{"web1", "web2"}[i]
		t.Logf("%s: %d requests, %d failed %v, %d acknowledged writes", filepath.Base(summary), sum.Requests, sum.Failed, sum.Errors, sum.Writes)
		if sum.Writes < 50 {
			t.Fatalf("%s: too little load to judge: %s", web, b)
		}
		if strict && sum.Failed != 0 {
			// Each failure with when it started and ended: to set against
			// the servers' logs in the test's directory.
			failed, _ := os.ReadFile(strings.TrimSuffix(summary, "-load.json") + "-failures.jsonl")
			t.Errorf("%s: %d requests failed: %v (the last: %s); each:\n%s", filepath.Base(summary), sum.Failed, sum.Errors, sum.LastError, failed)
		}
		vout, err := c.cmd("admin", "loadgen", "verify", "--ledger", ledger, "--others").CombinedOutput()
		if err != nil {
			t.Fatalf("%s verify: %v\n%s", web, err, vout)
		}
		t.Logf("%s verify: %s", filepath.Base(ledger), strings.TrimSpace(string(vout)))
	}
}

// waitNewIssuer waits up to 60 s for the TLS server at addr to show a new
// connection a certificate signed by the first CA of caPEM (the new one).
func waitNewIssuer(t *testing.T, c *cluster, addr string, caPEM []byte, since time.Time) {
	t.Helper()
	block, _ := pem.Decode(caPEM)
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	dial := c.net.Host("op").Dialer()
	testenv.WaitFor(t, 60*time.Second, func() bool {
		cfg, err := c.env.TLSFiles("admin").Config()
		if err != nil {
			return false
		}
		raw, err := dial("tcp", addr)
		if err != nil {
			return false
		}
		cfg.ServerName = strings.Split(addr, ":")[0]
		conn := tls.Client(raw, cfg)
		defer conn.Close()
		if err := conn.Handshake(); err != nil {
			return false
		}
		return conn.ConnectionState().PeerCertificates[0].CheckSignatureFrom(ca) == nil
	}, addr+" to show a certificate of the new CA")
	t.Logf("%s shows a certificate of the new CA %s after the rotation began", addr, time.Since(since).Round(100*time.Millisecond))
}

// waitNewPrimary waits until group i's primary is a member other than old
// and takes a write over TLS.
func waitNewPrimary(t *testing.T, c *cluster, i int, old string) {
	t.Helper()
	start := time.Now()
	testenv.WaitFor(t, 90*time.Second, func() bool {
		name, _, ok, err := c.env.Primary(i)
		if err != nil || !ok || name == old {
			return false
		}
		return probeWrite(c, i) == nil
	}, fmt.Sprintf("pg%d: a new primary other than %s taking writes", i, old))
	t.Logf("pg%d: new primary taking writes %s after the fault", i, time.Since(start).Round(100*time.Millisecond))
}

// kind is a host's role: zk, pg, web or op.
func kind(host string) string {
	for _, k := range []string{"zk", "pg", "web"} {
		if strings.HasPrefix(host, k) {
			return k
		}
	}
	return host
}

// probeWrite writes a row through node i's DSN (its primary, over TLS).
func probeWrite(c *cluster, i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.env.NodeDSN(i))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS public.failover_probe (at timestamptz); INSERT INTO public.failover_probe VALUES (now())")
	return err
}

// clusterSeed is the cluster's keystream seed, read from ZooKeeper as the
// operator.
func clusterSeed(t *testing.T, c *cluster) string {
	f := c.env.TLSFiles("admin")
	cfg := zksession.Config{Connect: c.env.ZKConnect()}
	if err := cfg.UseTLS(f.CA, f.Cert, f.Key); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := clustertest.OpenSessionWith(ctx, cfg, "the seed")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec, err := topo.ReadCluster(ctx, s, topo.MustPaths("/shardvisor", clusterID))
	if err != nil || rec.Seed == "" {
		t.Fatalf("the cluster record: %+v %v", rec, err)
	}
	return rec.Seed
}

// refusals: every server, across the bridge from the operator's host,
// refuses a plain client; refuses a client whose certificate is of
// another CA (the client trusting the right one, so that the server's
// refusal is what is tested); and the client that verifies against
// another CA refuses the server. The operator's certificate is served
// (the checks are not vacuous).
func refusals(t *testing.T, c *cluster) {
	other, err := pki.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := other.Issue(pki.Identity{Role: "admin", Host: "operator"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	otherFiles := pki.FilesIn(dir, "other")
	if err := other.Write(otherFiles.CA, filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	if err := leaf.Write(otherFiles.Cert, otherFiles.Key); err != nil {
		t.Fatal(err)
	}
	trustsOther, err := otherFiles.Config() // the other CA's client, trusting the other CA
	if err != nil {
		t.Fatal(err)
	}
	// The other CA's certificate, trusting the right CA.
	foreignCert := pki.Files{CA: c.env.TLSFiles("").CA, Cert: otherFiles.Cert, Key: otherFiles.Key}
	foreign, err := foreignCert.Config()
	if err != nil {
		t.Fatal(err)
	}
	good := c.adminTLS()
	type server struct {
		name, addr string
		kind       string // zk, pg, https
	}
	var servers []server
	for i := 1; i <= 3; i++ {
		servers = append(servers, server{fmt.Sprintf("zk%d", i), fmt.Sprintf("%s:%d", c.net.Host(fmt.Sprintf("zk%d", i)).Addr, zkPortBase+i-1), "zk"})
	}
	for i := 1; i <= 2; i++ {
		for m := 1; m <= 2; m++ {
			h := c.net.Host(fmt.Sprintf("pg%d-m%d", i, m)).Addr
			port := pgPortBase + (i - 1) + 100*(m-1)
			servers = append(servers, server{fmt.Sprintf("pg%d-m%d postgres", i, m), fmt.Sprintf("%s:%d", h, port), "pg"},
				server{fmt.Sprintf("pg%d-m%d patroni api", i, m), fmt.Sprintf("%s:%d", h, port+1000), "https"})
		}
	}
	for _, web := range []string{"web1", "web2"} {
		servers = append(servers, server{web + " supervisor admin", fmt.Sprintf("%s:%d", c.net.Host(web).Addr, adminPort), "https"})
	}
	servers = append(servers, server{"web1 router sidecar", fmt.Sprintf("%s:%d", c.net.Host("web1").Addr, routerPort), "https"})
	ctx := context.Background()
	// served: whether a TLS client with cfg gets an answer from s (a
	// request for HTTPS, a write and a read for ZooKeeper: with TLS 1.3 a
	// server refuses the client's certificate after the handshake).
	served := func(s server, cfg *tls.Config) error {
		cfg = cfg.Clone()
		cfg.ServerName = strings.Split(s.addr, ":")[0]
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", s.addr, cfg)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if s.kind == "zk" {
			_, err = conn.Write([]byte("srvr")) // a four-letter word: its answer
		} else {
			_, err = conn.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
		}
		if err == nil {
			_, err = conn.Read(make([]byte, 1))
		}
		return err
	}
	for _, s := range servers {
		switch s.kind {
		case "pg":
			// PostgreSQL's clients authenticate by password over TLS (the
			// moves' stream role by a certificate of the CA alone:
			// TestFaultsTLSEnsemble refuses another CA's there).
			for _, q := range []string{"sslmode=disable", // plain
				"sslmode=verify-full&sslrootcert=" + otherFiles.CA} { // verifying against another CA
				dsn := fmt.Sprintf("postgres://postgres:%s@%s/postgres?connect_timeout=5&%s", c.env.Password(), s.addr, q)
				if conn, err := pgx.Connect(ctx, dsn); err == nil {
					conn.Close(ctx)
					t.Errorf("%s took a client with %s", s.name, q)
				}
			}
			dsn := fmt.Sprintf("postgres://postgres:%s@%s/postgres?connect_timeout=5&%s", c.env.Password(), s.addr, c.env.PGSSLParams())
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Errorf("%s refused the right client: %v", s.name, err)
				continue
			}
			conn.Close(ctx)
			continue
		case "zk":
			// A real plain ZooKeeper client gets no session.
			dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
				return net.DialTimeout(network, addr, timeout)
			}
			zc, events, err := zk.Connect([]string{s.addr}, 5*time.Second, zk.WithDialer(dial), zk.WithLogger(zkQuiet{}))
			if err == nil {
				deadline := time.After(5 * time.Second)
			wait:
				for {
					select {
					case ev := <-events:
						if ev.State == zk.StateHasSession {
							t.Errorf("%s gave a plain client a session", s.name)
							break wait
						}
					case <-deadline:
						break wait
					}
				}
				zc.Close()
			}
		case "https":
			// Go's TLS servers answer a plain request with a 400 saying so;
			// Patroni's closes. Anything else answered it.
			plain := &http.Client{Timeout: 5 * time.Second}
			if res, err := plain.Get("http://" + s.addr + "/"); err == nil {
				b := make([]byte, 200)
				n, _ := res.Body.Read(b)
				res.Body.Close()
				if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(b[:n]), "HTTPS server") {
					t.Errorf("%s answered a plain HTTP client: %s %q", s.name, res.Status, b[:n])
				}
			}
		}
		if err := served(s, foreign); err == nil {
			t.Errorf("%s served a client certificate of another CA", s.name)
		}
		if err := served(s, trustsOther); err == nil {
			t.Errorf("%s was trusted by a client of another CA", s.name)
		}
		if err := served(s, good); err != nil {
			t.Errorf("%s refused the operator's certificate: %v", s.name, err)
		}
	}
}

// zkQuiet drops go-zookeeper's log lines (the plain client's failures).
type zkQuiet struct{}

func (zkQuiet) Printf(string, ...any) {}
