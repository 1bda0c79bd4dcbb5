package pki

import (
	"crypto/tls"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeSet makes a CA in dir and issues names (role/host pairs) into it.
func writeSet(t *testing.T, dir string, ids map[string]Identity) {
	t.Helper()
	ca, err := NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Write(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	for name, id := range ids {
		l, err := ca.Issue(id, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		f := FilesIn(dir, name)
		if err := l.Write(f.Cert, f.Key); err != nil {
			t.Fatal(err)
		}
	}
}

func config(t *testing.T, f Files) *tls.Config {
	t.Helper()
	c, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serve accepts one TLS connection and reports the peer it verified.
func serve(t *testing.T, cfg *tls.Config) (addr string, peer chan any) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	peer = make(chan any, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			peer <- err
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			peer <- err
			return
		}
		id, ok := Peer(tc.ConnectionState())
		if !ok {
			peer <- "no identity"
			return
		}
		peer <- id
	}()
	return ln.Addr().String(), peer
}

func TestMutualTLSCarriesTheIdentity(t *testing.T) {
	dir := t.TempDir()
	writeSet(t, dir, map[string]Identity{
		"zk1":  {Role: "zookeeper", Host: "zk1", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}},
		"web1": {Role: "webhead", Host: "web1"},
	})
	addr, peer := serve(t, config(t, FilesIn(dir, "zk1")))
	c, err := Dialer(config(t, FilesIn(dir, "web1")))("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	got := <-peer
	id, ok := got.(Identity)
	if !ok || id.Role != "webhead" || id.Host != "web1" {
		t.Fatalf("server saw %v, want webhead/web1", got)
	}
	if id.DN() != "CN=web1,OU=webhead,O=shardvisor" {
		t.Errorf("DN = %q", id.DN())
	}
}

func TestRefusals(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	ids := map[string]Identity{
		"zk1":  {Role: "zookeeper", Host: "zk1", DNSNames: []string{"zk1.example"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}},
		"web1": {Role: "webhead", Host: "web1"},
	}
	writeSet(t, dir, ids)
	writeSet(t, other, ids) // same names, another CA

	t.Run("server from another CA", func(t *testing.T) {
		addr, _ := serve(t, config(t, FilesIn(other, "zk1")))
		if _, err := Dialer(config(t, FilesIn(dir, "web1")))("tcp", addr, 5*time.Second); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("dial = %v, want a certificate error", err)
		}
	})
	t.Run("client from another CA", func(t *testing.T) {
		addr, peer := serve(t, config(t, FilesIn(dir, "zk1")))
		c, err := Dialer(config(t, FilesIn(other, "web1")))("tcp", addr, 5*time.Second)
		if err == nil {
			// TLS 1.3: the client learns of the refusal on its first read.
			_, err = c.Read(make([]byte, 1))
			c.Close()
		}
		if err == nil {
			t.Fatal("a client certificate from another CA was accepted")
		}
		if got := <-peer; got == nil {
			t.Fatal("server accepted")
		} else if _, ok := got.(Identity); ok {
			t.Fatalf("server saw identity %v", got)
		}
	})
	t.Run("client without a certificate", func(t *testing.T) {
		addr, peer := serve(t, config(t, FilesIn(dir, "zk1")))
		cfg := config(t, FilesIn(dir, "web1"))
		cfg.Certificates = nil
		c, err := Dialer(cfg)("tcp", addr, 5*time.Second)
		if err == nil {
			_, err = c.Read(make([]byte, 1))
			c.Close()
		}
		if err == nil {
			t.Fatal("a client without a certificate was accepted")
		}
		if _, ok := (<-peer).(Identity); ok {
			t.Fatal("server saw an identity")
		}
	})
	t.Run("server name not in its certificate", func(t *testing.T) {
		addr, _ := serve(t, config(t, FilesIn(dir, "zk1")))
		_, port, _ := net.SplitHostPort(addr)
		// localhost resolves to 127.0.0.1, but the certificate names only
		// zk1.example and the IP: the name dialled must be in it.
		if _, err := Dialer(config(t, FilesIn(dir, "web1")))("tcp", "localhost:"+port, 5*time.Second); err == nil || !strings.Contains(err.Error(), "localhost") {
			t.Fatalf("dial = %v, want a name mismatch", err)
		}
	})
	t.Run("client certificate is not a server's", func(t *testing.T) {
		// web1 has no names and no serverAuth usage: it cannot pose as
		// ZooKeeper even to a client that trusts the CA.
		addr, _ := serve(t, config(t, FilesIn(dir, "web1")))
		if _, err := Dialer(config(t, FilesIn(dir, "zk1")))("tcp", addr, 5*time.Second); err == nil {
			t.Fatal("a client-only certificate served TLS")
		}
	})
}

func TestIdentityValidate(t *testing.T) {
	for _, bad := range []Identity{
		{Role: "webhead", Host: ""},
		{Role: "", Host: "web1"},
		{Role: "webhead", Host: "web1,OU=admin"},
		{Role: "admin\"", Host: "x"},
		{Role: "webhead", Host: "a=b"},
		{Role: "webhead", Host: strings.Repeat("a", 64)},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil", bad)
		}
	}
	if err := (Identity{Role: "patroni", Host: "db-1.example"}).Validate(); err != nil {
		t.Errorf("valid identity refused: %v", err)
	}
}

func TestFilesConfigNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	if _, err := (Files{CA: filepath.Join(dir, "ca.crt")}).Config(); err == nil || !strings.Contains(err.Error(), "key") {
		t.Errorf("Config without cert/key = %v", err)
	}
	if _, err := FilesIn(dir, "nobody").Config(); err == nil || !strings.Contains(err.Error(), "ca.crt") {
		t.Errorf("Config with no files = %v", err)
	}
}

func TestLoadCARoundTrip(t *testing.T) {
	dir := t.TempDir()
	writeSet(t, dir, nil)
	ca, err := LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := ca.Issue(Identity{Role: "admin", Host: "alice"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Cert.CheckSignatureFrom(ca.Cert); err != nil {
		t.Fatal(err)
	}
	// The identity a session with this certificate has in ZooKeeper's
	// ACLs is the DN the certificate's subject prints as.
	f := FilesIn(dir, "alice")
	if err := l.Write(f.Cert, f.Key); err != nil {
		t.Fatal(err)
	}
	if dn, err := f.SubjectDN(); err != nil || dn != (Identity{Role: "admin", Host: "alice"}).DN() {
		t.Fatalf("SubjectDN %q (%v), want %q", dn, err, (Identity{Role: "admin", Host: "alice"}).DN())
	}
}

// TestLoadCARefusesAKeyOfAnotherCertificate: a rotation half done (the new
// key beside the old certificate) must not sign leaves that verify against
// nothing.
func TestLoadCARefusesAKeyOfAnotherCertificate(t *testing.T) {
	dir := t.TempDir()
	a, err := NewCA("a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewCA("b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Write(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "a.key")); err != nil {
		t.Fatal(err)
	}
	if err := b.Write(filepath.Join(dir, "b.crt"), filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")); err == nil || !strings.Contains(err.Error(), "is not the key of") {
		t.Fatalf("LoadCA of a mismatched pair: %v", err)
	}
	if _, err := LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "a.key")); err != nil {
		t.Fatalf("LoadCA of a matching pair: %v", err)
	}
}
