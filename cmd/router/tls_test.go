package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// tlsSet is a CA with a server certificate for 127.0.0.1 and a client
// certificate, written to dir (renamed over what was there: a rotation).
type tlsSet struct {
	pool   *x509.CertPool
	client tls.Certificate
}

func writeTLSSet(t *testing.T, dir string) tlsSet {
	t.Helper()
	ca, err := pki.NewCA("router-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue(pki.Identity{Role: "router", Host: "web1", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ca.Issue(pki.Identity{Role: "webhead", Host: "web1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	for _, err := range []error{ca.Write(filepath.Join(tmp, "ca.crt"), filepath.Join(tmp, "ca.key")), srv.Write(filepath.Join(tmp, "r.crt"), filepath.Join(tmp, "r.key")),
		cli.Write(filepath.Join(tmp, "c.crt"), filepath.Join(tmp, "c.key"))} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"ca.crt", "r.crt", "r.key"} {
		if err := os.Rename(filepath.Join(tmp, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(tmp, "c.crt"), filepath.Join(tmp, "c.key"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return tlsSet{pool: pool, client: pair}
}

// With --tls-*, the router serves HTTPS to clients with a certificate of
// its CA only, may listen beyond loopback without --allow-public, and
// takes rotated files without a restart (issue 41): a plain client, a
// client without a certificate and one of the CA rotated away are refused.
func TestRouterServesHTTPSWithRotation(t *testing.T) {
	dir := t.TempDir()
	set1 := writeTLSSet(t, dir)
	m, err := bucketmap.New(4, clustertest.Nodes(2), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		app := newApp()
		app.Writer, app.ErrWriter = io.Discard, &errb
		exit <- cliutil.Exec(ctx, app, []string{"router", "--listen", addr, "--map-file", clustertest.WriteMapFile(t, t.TempDir(), m),
			"--tls-ca", filepath.Join(dir, "ca.crt"), "--tls-cert", filepath.Join(dir, "r.crt"), "--tls-key", filepath.Join(dir, "r.key")})
	}()
	var stopOnce sync.Once
	code := 0
	stop := func() int {
		stopOnce.Do(func() { cancel(); code = <-exit })
		return code
	}
	t.Cleanup(func() { stop() })
	get := func(cfg *tls.Config, scheme string) (int, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
		resp, err := c.Get(scheme + "://" + addr + "/v1/route?uid=alice")
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	with := func(s tlsSet) *tls.Config {
		return &tls.Config{RootCAs: s.pool, Certificates: []tls.Certificate{s.client}}
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { code, _ := get(with(set1), "https"); return code == 200 }, "the router to answer over HTTPS")

	if code, err := get(nil, "http"); err == nil && code == 200 {
		t.Fatal("a plain HTTP client was answered")
	}
	if code, err := get(&tls.Config{RootCAs: set1.pool}, "https"); err == nil && code == 200 {
		t.Fatal("a client without a certificate was answered")
	}
	time.Sleep(10 * time.Millisecond) // modification times of their own
	set2 := writeTLSSet(t, dir)
	if code, err := get(with(set2), "https"); err != nil || code != 200 {
		t.Fatalf("after the rotation, the new CA's client: %d %v", code, err)
	}
	if code, err := get(with(set1), "https"); err == nil && code == 200 {
		t.Fatal("after the rotation, a client of the CA rotated away was answered")
	}
	if code := stop(); code != 0 {
		t.Fatalf("router exit %d: %s", code, errb.String())
	}
}

// A non-loopback address needs TLS or --allow-public; TLS needs all
// three files.
func TestRouterListenRules(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:1"}, "--allow-public"},
		{[]string{"--listen", "127.0.0.1:0", "--tls-ca", "/nonexistent/ca.crt"}, "--tls-ca, --tls-cert, --tls-key"},
	} {
		var errb bytes.Buffer
		app := newApp()
		app.Writer, app.ErrWriter = io.Discard, &errb
		if code := cliutil.Exec(context.Background(), app, append([]string{"router"}, tc.args...)); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d %q, want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
