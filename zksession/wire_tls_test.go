package zksession_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/zksession"
)

// sniffer forwards TCP to one server and keeps every byte that passes, as
// someone on the path between a host and ZooKeeper would see them.
type sniffer struct {
	ln  net.Listener
	mu  sync.Mutex
	buf bytes.Buffer
}

func sniff(t *testing.T, target string) *sniffer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &sniffer{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			for _, p := range [][2]net.Conn{{c, u}, {u, c}} {
				go func(dst, src net.Conn) {
					defer dst.Close()
					_, _ = io.Copy(dst, io.TeeReader(src, s))
				}(p[0], p[1])
			}
		}
	}()
	return s
}

func (s *sniffer) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(b)
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
	s, err := zksession.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
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
	ps := sniff(t, plain.Servers[0])
	wireSession(t, zksession.Config{Connect: ps.ln.Addr().String()}, plain.Root+"/wire", secret)
	if n := bytes.Count(ps.seen(), secret); n < 2 {
		t.Fatalf("the plain wire shows the secret %d times, want the password and the record: the sniffer sees nothing", n)
	}

	z := testenv.StartTLSZK(t)
	ts := sniff(t, z.Servers[0])
	f := z.Identity(t, "webhead", "web1")
	tc, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	wireSession(t, zksession.Config{Connect: ts.ln.Addr().String(), Dial: pki.Dialer(tc)}, "/wire", secret)
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
