package devenv_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// Every certificate rotated, with a new CA, under a steady load of
// queries through pools that open new connections all the time and a
// ZooKeeper session held throughout: no query fails, the session
// survives, and a new connection to each server (ZooKeeper's client port,
// a plain PostgreSQL node, a group's members and their Patroni REST APIs)
// shows the new certificate within 60 s.
func TestFaultsTLSRotationUnderLoad(t *testing.T) {
	testenv.Faults(t)
	e := throwawayWith(t, devenv.Config{PGNodes: 2, HA: 2, HANodes: []int{2}, TLS: true})
	if err := e.Up(); err != nil {
		t.Fatal(err)
	}
	if st, ok := status(t, e); !ok {
		t.Fatalf("not healthy after up:\n%s", st)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	web := e.TLSFiles("webhead")

	// The load: pools whose connections live 300 ms, so that new
	// connections are made all through the rotation.
	var queries, failed atomic.Int64
	var failMu sync.Mutex
	var failures []string
	var wg sync.WaitGroup
	for _, i := range []int{1, 2} {
		cfg, err := dbnode.PoolConfig(bucketmap.Node{ID: bucketmap.NodeID("pg" + strconv.Itoa(i)), DSN: e.NodeDSN(i)})
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConnLifetime, cfg.MaxConnLifetimeJitter, cfg.MaxConns = 300*time.Millisecond, 0, 4
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		for w := 0; w < 3; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
					var one int
					err := pool.QueryRow(qctx, "SELECT 1").Scan(&one)
					qcancel()
					if ctx.Err() != nil {
						return
					}
					queries.Add(1)
					if err != nil {
						failed.Add(1)
						failMu.Lock()
						failures = append(failures, fmt.Sprintf("pg%d: %v", i, err))
						failMu.Unlock()
					}
					time.Sleep(10 * time.Millisecond)
				}
			}()
		}
	}
	// A ZooKeeper session on the web head's certificate, read from its
	// files at each (re)connection.
	dial, err := web.ReloadingDialer()
	if err != nil {
		t.Fatal(err)
	}
	zc, zev, err := zk.Connect(strings.Split(e.ZKConnect(), ","), 10*time.Second, zk.WithLogger(quietLog{}), zk.WithDialer(dial))
	if err != nil {
		t.Fatal(err)
	}
	defer zc.Close()
	testenv.WaitFor(t, 20*time.Second, func() bool { return zc.State() == zk.StateHasSession }, "a ZooKeeper session")
	sessionID := zc.SessionID()
	var expired atomic.Bool
	var zkOps, zkErrs atomic.Int64
	go func() {
		for ev := range zev {
			if ev.State == zk.StateExpired {
				expired.Store(true)
			}
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if _, _, err := zc.Exists("/"); err != nil {
				zkErrs.Add(1)
			}
			zkOps.Add(1)
			time.Sleep(50 * time.Millisecond)
		}
	}()
	time.Sleep(2 * time.Second) // deliberate: the load runs before the rotation

	// What a new connection shows now, per server.
	probes := map[string]func() (string, error){}
	for i := 1; i <= devenv.ZKServers; i++ {
		addr := "127.0.0.1:" + strconv.Itoa(e.ZKPort(i))
		probes["zk"+strconv.Itoa(i)] = func() (string, error) { return peerSerial(e, addr, "127.0.0.1") }
	}
	probes["pg1"] = func() (string, error) { return pgSerial(ctx, e.NodeDSN(1)) }
	for m := 1; m <= 2; m++ {
		member := fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?%s", e.Password(), e.MemberPort(2, m), e.PGSSLParams())
		probes[fmt.Sprintf("pg2-m%d", m)] = func() (string, error) { return pgSerial(ctx, member) }
		api := "127.0.0.1:" + strconv.Itoa(e.MemberAPIPort(2, m))
		probes[fmt.Sprintf("patroni-pg2-m%d", m)] = func() (string, error) { return peerSerial(e, api, "127.0.0.1") }
	}
	file := func(name string) string {
		switch {
		case strings.HasPrefix(name, "patroni-"):
			return e.TLSFiles(name[:len("patroni-pg2")]).Cert
		default:
			return e.TLSFiles(name).Cert
		}
	}
	before := map[string]string{}
	for name, p := range probes {
		s, err := p()
		if err != nil {
			t.Fatalf("%s before the rotation: %v", name, err)
		}
		before[name] = s
	}

	start := time.Now()
	if err := e.RotateTLS(true); err != nil {
		t.Fatal(err)
	}
	done := time.Now()
	t.Logf("RotateTLS(new CA) took %s", done.Sub(start).Round(time.Millisecond))
	for name, p := range probes {
		want, err := devenv.CertSerial(file(name))
		if err != nil {
			t.Fatal(err)
		}
		if want == before[name] {
			t.Fatalf("%s: its certificate file was not issued again", name)
		}
		var last string
		testenv.WaitFor(t, 60*time.Second, func() bool {
			last, _ = p()
			return last == want
		}, name+" to show its new certificate to a new connection")
		t.Logf("%s: new certificate on a new connection %s after the rotation began (%s after it returned)",
			name, time.Since(start).Round(time.Millisecond), time.Since(done).Round(time.Millisecond))
	}
	// The new CA's client certificate is taken everywhere: a fresh session.
	if c, ok := session(t, e, dialAs(t, web), 20*time.Second); !ok {
		t.Fatal("no ZooKeeper session with the web head's new certificate")
	} else {
		c.Close()
	}
	time.Sleep(2 * time.Second) // deliberate: the load runs on after the rotation
	cancel()
	wg.Wait()
	t.Logf("load: %d queries, %d failed; ZooKeeper: %d reads, %d refused while the session moved between servers",
		queries.Load(), failed.Load(), zkOps.Load(), zkErrs.Load())
	if queries.Load() < 100 {
		t.Fatalf("too little load to judge: %d queries", queries.Load())
	}
	if failed.Load() != 0 {
		t.Fatalf("%d queries failed during the rotation, the first: %v", failed.Load(), failures[:min(5, len(failures))])
	}
	if expired.Load() || zc.SessionID() != sessionID || zc.State() != zk.StateHasSession {
		t.Fatalf("the ZooKeeper session did not survive: expired %v, id %x (was %x), state %v", expired.Load(), zc.SessionID(), sessionID, zc.State())
	}
}

// peerSerial dials addr over TLS as the web head (the CA as of now) and
// returns the serial of the certificate the server shows.
func peerSerial(e *devenv.Env, addr, name string) (string, error) {
	f := e.TLSFiles("webhead")
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return "", err
	}
	ca, err := os.ReadFile(f.CA)
	if err != nil {
		return "", err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", addr,
		&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, ServerName: name})
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// pgSerial makes a new connection to dsn and returns the serial of the
// server's certificate.
func pgSerial(ctx context.Context, dsn string) (string, error) {
	cfg, err := dbnode.ConnConfig(bucketmap.Node{ID: "probe", DSN: dsn})
	if err != nil {
		return "", err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	tc, ok := c.PgConn().Conn().(*tls.Conn)
	if !ok {
		return "", fmt.Errorf("not over TLS: %T", c.PgConn().Conn())
	}
	return tc.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}
