package zksession_test

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/faultproxy"
	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/zksession"
)

// sniffer keeps every byte that passes between a client and one server
// (through a faultproxy), as someone on the path would see them.
type sniffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// sniff returns the sniffer and the address clients dial to pass it.
func sniff(t *testing.T, target string) (*sniffer, string) {
	t.Helper()
	s := &sniffer{}
	var d net.Dialer
	p, err := faultproxy.NewWith(target, faultproxy.Options{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return tapped{c, s}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return s, p.Addr()
}

// tapped is the proxy's connection to the server: what it reads is the
// server's, what it writes the client's.
type tapped struct {
	net.Conn
	s *sniffer
}

func (c tapped) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.s.keep(b[:n])
	return n, err
}

func (c tapped) Write(b []byte) (int, error) {
	c.s.keep(b)
	return c.Conn.Write(b)
}

func (s *sniffer) keep(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(b)
}

func (s *sniffer) seen() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.buf.Bytes())
}

// wireSession authenticates with a digest credential (a password on the
// wire) and writes secret into a record at, through cfg's connect string.
func wireSession(t *testing.T, cfg zksession.Config, at string, secret []byte) {
	t.Helper()
	cfg.Auth = []zksession.Credential{{User: "sniffed", Password: string(secret)}}
	s := zktest.Session(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.CreateAll(ctx, at); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Set(ctx, at, secret, zksession.AnyVersion); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, at); err != nil {
		t.Fatal(err)
	}
}

// Someone on the network between a host and ZooKeeper: on the plain
// ensemble they read a digest password and the records (the control: the
// sniffer sees what passes); over TLS they see a TLS handshake and
// nothing of either.
func TestIntegrationZooKeeperWireIsEncrypted(t *testing.T) {
	secret := []byte("s3cret-" + time.Now().Format("150405.000000"))

	plain := testenv.StartZK(t)
	ps, addr := sniff(t, plain.Servers[0])
	wireSession(t, zksession.Config{Connect: addr}, plain.Root+"/wire", secret)
	if n := bytes.Count(ps.seen(), secret); n < 2 {
		t.Fatalf("the plain wire shows the secret %d times, want the password and the record: the sniffer sees nothing", n)
	}

	z := testenv.StartTLSZK(t)
	ts, addr := sniff(t, z.Servers[0])
	f := z.Identity(t, "webhead", "web1")
	tc, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	wireSession(t, zksession.Config{Connect: addr, Dial: pki.Dialer(tc)}, "/wire", secret)
	seen := ts.seen()
	if len(seen) < 100 || seen[0] != 0x16 || seen[1] != 0x03 {
		t.Fatalf("the TLS wire: %d bytes starting %x, want a TLS handshake record", len(seen), seen[:min(len(seen), 4)])
	}
	for _, leak := range [][]byte{secret, []byte("sniffed"), []byte("/wire")} {
		if bytes.Contains(seen, leak) {
			t.Errorf("the TLS wire shows %q in clear", leak)
		}
	}
}
