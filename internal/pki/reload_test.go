package pki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// rotate writes a new CA and a client certificate of it over dir's files
// (new files renamed over the old, as a rotation does) and returns a
// server configuration of that CA for 127.0.0.1 that takes only its
// client certificates.
func rotate(t *testing.T, dir string) *tls.Config {
	t.Helper()
	ca, err := NewCA("rot", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(Identity{Role: "webhead", Host: "web1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.Issue(Identity{Role: "zookeeper", Host: "zk1", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ca.Write(filepath.Join(tmp, "ca.crt"), filepath.Join(tmp, "ca.key")))
	must(client.Write(filepath.Join(tmp, "c.crt"), filepath.Join(tmp, "c.key")))
	must(server.Write(filepath.Join(tmp, "s.crt"), filepath.Join(tmp, "s.key")))
	for _, f := range []string{"ca.crt", "c.crt", "c.key"} {
		must(os.Rename(filepath.Join(tmp, f), filepath.Join(dir, f)))
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(tmp, "s.crt"), filepath.Join(tmp, "s.key"))
	must(err)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
}

// A ZooKeeper client's dialer (zksession.Config.UseTLS) reads its CA and
// client certificate again when they are replaced on disk: a rotation of
// both, the server rotated too, is used by the next dial with no restart
// (issue 41). A server of a CA no longer trusted is refused.
func TestReloadingDialerFollowsARotation(t *testing.T) {
	dir := t.TempDir()
	var srv atomic.Pointer[tls.Config]
	srv.Store(rotate(t, dir))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				tc := tls.Server(c, srv.Load())
				if tc.Handshake() == nil {
					_, _ = tc.Write([]byte("k"))
				}
				tc.Close()
			}()
		}
	}()
	dial, err := Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "c.crt"), Key: filepath.Join(dir, "c.key")}.ReloadingDialer()
	if err != nil {
		t.Fatal(err)
	}
	try := func() error {
		c, err := dial("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		// The server's verdict on the client's certificate (TLS 1.3)
		// comes with the first read.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		return err
	}
	if err := try(); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	old := srv.Load()
	time.Sleep(10 * time.Millisecond) // modification times of their own
	srv.Store(rotate(t, dir))
	if err := try(); err != nil {
		t.Fatalf("after the rotation, with the dialer made before it: %v", err)
	}
	srv.Store(old) // the CA rotated away
	if err := try(); err == nil {
		t.Fatal("a server of the CA rotated away was trusted")
	}
}

// A full check with no name to check fails closed: x509 would skip the
// name with an empty one.
func TestClientConfigWithoutANameFailsClosed(t *testing.T) {
	dir := t.TempDir()
	srv := rotate(t, dir)
	r, err := NewReloader(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "c.crt"), filepath.Join(dir, "c.key"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := r.ClientConfig(&tls.Config{}, VerifyFull)
	cs := tls.ConnectionState{PeerCertificates: []*x509.Certificate{srv.Certificates[0].Leaf}}
	if cs.PeerCertificates[0] == nil {
		leaf, err := x509.ParseCertificate(srv.Certificates[0].Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		cs.PeerCertificates[0] = leaf
	}
	if err := cfg.VerifyConnection(cs); err == nil {
		t.Fatal("a certificate was accepted with no name to check it against")
	}
	cs.ServerName = "127.0.0.1"
	if err := cfg.VerifyConnection(cs); err != nil {
		t.Fatalf("with the handshake's name: %v", err)
	}
}
