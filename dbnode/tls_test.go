package dbnode

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/pki"
)

// tlsServer is a TLS listener standing in for PostgreSQL's after its
// SSLRequest: it presents the certificate in cert and takes client
// certificates of the CA in clientCA, both swappable.
type tlsServer struct {
	ln       net.Listener
	cert     atomic.Pointer[tls.Certificate]
	clientCA atomic.Pointer[x509.CertPool]
}

func startTLSServer(t *testing.T) *tlsServer {
	t.Helper()
	s := &tlsServer{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			cfg := &tls.Config{Certificates: []tls.Certificate{*s.cert.Load()}, ClientCAs: s.clientCA.Load(), ClientAuth: tls.RequireAndVerifyClientCert}
			go func() {
				tc := tls.Server(c, cfg)
				_ = tc.Handshake()
				tc.Close()
			}()
		}
	}()
	return s
}

// issueTo writes a CA's certificate to dir/ca.pem and a client
// certificate and key to dir/client.{pem,key} by renaming new files over
// them (as a rotation does), and returns the CA's pool and a server
// certificate of the CA for name.
func issueTo(t *testing.T, dir, name string) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	ca, err := pki.NewCA("ca-"+name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(pki.Identity{Role: "router", Host: "web1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.Issue(pki.Identity{Role: "postgres", Host: name, DNSNames: []string{name}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	if err := ca.Write(filepath.Join(tmp, "ca.pem"), filepath.Join(tmp, "ca.key")); err != nil {
		t.Fatal(err)
	}
	if err := client.Write(filepath.Join(tmp, "client.pem"), filepath.Join(tmp, "client.key")); err != nil {
		t.Fatal(err)
	}
	if err := server.Write(filepath.Join(tmp, "server.pem"), filepath.Join(tmp, "server.key")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.pem", "client.pem", "client.key"} {
		if err := os.Rename(filepath.Join(tmp, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(tmp, "server.pem"), filepath.Join(tmp, "server.key"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool, pair
}

// handshake dials the server with the TLS configuration pgx would use for
// the node's first host.
func handshake(t *testing.T, cfg *tls.Config, addr string) error {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	// TLS 1.3: the server's verdict on the client's certificate comes
	// with the first read.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if err != nil && !strings.Contains(err.Error(), "EOF") {
		return err
	}
	return nil
}

// A node's TLS files replaced on disk (a rotation) are used by the next
// connection of a configuration parsed before: the new CA to verify the
// server, the new client certificate to prove who connects (issue 41).
// A server of another CA, or with another name, is refused.
func TestTLSFilesRotateWithoutANewConfig(t *testing.T) {
	dir := t.TempDir()
	srv := startTLSServer(t)
	port := srv.ln.Addr().(*net.TCPAddr).Port
	pool1, cert1 := issueTo(t, dir, "localhost")
	srv.cert.Store(&cert1)
	srv.clientCA.Store(pool1)

	dsn := "postgres://app@localhost:" + strconv.Itoa(port) + "/db?sslmode=verify-full&sslrootcert=" + filepath.Join(dir, "ca.pem") +
		"&sslcert=" + filepath.Join(dir, "client.pem") + "&sslkey=" + filepath.Join(dir, "client.key")
	cc, err := ConnConfig(bucketmap.Node{ID: "pg1", DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := handshake(t, cc.TLSConfig, addr); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}

	// Rotation: a new CA, server and client certificates; the server
	// takes only the new client certificates.
	time.Sleep(10 * time.Millisecond) // a modification time of its own
	pool2, cert2 := issueTo(t, dir, "localhost")
	srv.cert.Store(&cert2)
	srv.clientCA.Store(pool2)
	if err := handshake(t, cc.TLSConfig, addr); err != nil {
		t.Fatalf("after the rotation, with the configuration parsed before it: %v", err)
	}

	// A server of another CA: refused.
	rogue := t.TempDir()
	_, certR := issueTo(t, rogue, "localhost")
	srv.cert.Store(&certR)
	if err := handshake(t, cc.TLSConfig, addr); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a server certificate of another CA: %v", err)
	}
	// verify-full: a server of the trusted CA under another name (a
	// rotation to a CA that also signed it): refused.
	pool3, certOther := issueTo(t, dir, "other.example")
	srv.cert.Store(&certOther)
	srv.clientCA.Store(pool3)
	if err := handshake(t, cc.TLSConfig, addr); err == nil || !strings.Contains(err.Error(), "other.example") {
		t.Fatalf("a server certificate for another name: %v", err)
	}
}

// A file that does not load (a rotation half done) keeps the last good
// set in use; one that never loaded is an error naming it.
func TestReloaderKeepsTheLastGoodSet(t *testing.T) {
	dir := t.TempDir()
	issueTo(t, dir, "localhost")
	r, err := pki.NewReloader(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), []byte("half written"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := r.ClientConfig(&tls.Config{ServerName: "localhost"}, pki.VerifyFull)
	if _, err := cfg.GetClientCertificate(nil); err != nil {
		t.Fatalf("with a half-written CA file, the last good set: %v", err)
	}
	if _, err := pki.NewReloader(filepath.Join(dir, "ca.pem"), "", ""); err == nil || !strings.Contains(err.Error(), "ca.pem") {
		t.Fatalf("a CA file that never loaded: %v", err)
	}
	if _, err := pki.NewReloader("", filepath.Join(dir, "client.pem"), ""); err == nil {
		t.Fatal("a certificate without its key was taken")
	}
}
