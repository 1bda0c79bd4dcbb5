package faultproxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// echoServer echoes everything and counts the bytes it received.
type echoServer struct {
	ln       net.Listener
	received atomic.Int64
	accepted atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func newEchoServer(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						s.received.Add(int64(n))
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						if errors.Is(err, io.EOF) {
							// half-close back after echoing everything
							_ = c.(*net.TCPConn).CloseWrite()
						}
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// echoProxy is an echo server and a proxy in front of it, in Pass mode.
func echoProxy(t *testing.T) (*echoServer, *Proxy) {
	t.Helper()
	srv := newEchoServer(t)
	return srv, newProxy(t, srv.ln.Addr().String())
}

func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// roundTrip writes msg and expects it echoed back.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(buf) != msg {
		t.Fatalf("echo = %q, want %q", buf, msg)
	}
}

// pinged is a connection through p that has carried a round trip.
func pinged(t *testing.T, p *Proxy) *net.TCPConn {
	t.Helper()
	c := dial(t, p.Addr())
	roundTrip(t, c, "ping")
	return c
}

// expectDead expects the connection to fail (reset or EOF) within 5s.
func expectDead(t *testing.T, c net.Conn) error {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection still open after 5s")
		}
		return err
	}
}

// expectSilent expects no bytes and no error on c for d.
func expectSilent(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("expected silence, got n=%d err=%v", n, err)
	}
	_ = c.SetReadDeadline(time.Time{})
}

// dialExpectReset connects and expects the connection to be reset, either
// already during connect (the RST can beat the connect's completion check)
// or on the first read.
func dialExpectReset(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		if !isReset(err) {
			t.Fatalf("dial: want reset, got %v", err)
		}
		return
	}
	defer c.Close()
	if err := expectDead(t, c); !isReset(err) {
		t.Fatalf("want reset, got %v", err)
	}
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPass(t *testing.T) {
	_, p := echoProxy(t)
	c := dial(t, p.Addr())
	roundTrip(t, c, "hello")
	roundTrip(t, c, "world!")
	// Counters are updated after the write, so the echo can beat them.
	waitUntil(t, "byte counters", func() bool {
		st := p.Stats()
		return st.BytesToTarget == 11 && st.BytesToClient == 11
	})
	if st := p.Stats(); st.Accepted != 1 || st.Active != 1 {
		t.Fatalf("stats = %+v", st)
	}
	if p.Mode() != Pass || p.Mode().String() != "pass" {
		t.Fatalf("mode = %v", p.Mode())
	}
}

func TestPassLargeTransfer(t *testing.T) {
	_, p := echoProxy(t)
	c := dial(t, p.Addr())
	const size = 4 << 20
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(bufio.NewReader(c))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if len(got) != size {
		t.Fatalf("got %d bytes, want %d", len(got), size)
	}
	for i := range got {
		if got[i] != data[i] {
			t.Fatalf("byte %d differs", i)
		}
	}
	waitUntil(t, "connection finished", func() bool { return p.Stats().Active == 0 })
	if st := p.Stats(); st.BytesToTarget != size || st.BytesToClient != size {
		t.Fatalf("stats = %+v", st)
	}
}

func TestHalfClosePropagates(t *testing.T) {
	_, p := echoProxy(t)
	c := dial(t, p.Addr())
	if _, err := c.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "bye" {
		t.Fatalf("got %q, %v", got, err)
	}
}

func TestResetExistingAndNew(t *testing.T) {
	_, p := echoProxy(t)
	c := pinged(t, p)

	p.SetMode(Reset)
	if err := expectDead(t, c); !isReset(err) {
		t.Fatalf("existing connection: want reset, got %v", err)
	}
	dialExpectReset(t, p.Addr()) // new connections are accepted and reset

	waitUntil(t, "no active connections", func() bool { return p.Stats().Active == 0 })
	if st := p.Stats(); st.Resets < 2 {
		t.Fatalf("stats = %+v", st)
	}

	p.SetMode(Pass)
	c3 := dial(t, p.Addr())
	roundTrip(t, c3, "again")
}

func TestBlackholeExisting(t *testing.T) {
	srv, p := echoProxy(t)
	c := pinged(t, p)
	before := srv.received.Load()

	p.SetMode(Blackhole)
	if _, err := c.Write([]byte("lost in space")); err != nil {
		t.Fatalf("write during blackhole should succeed: %v", err)
	}
	expectSilent(t, c, 300*time.Millisecond)
	if got := srv.received.Load(); got != before {
		t.Fatalf("server received %d bytes during blackhole", got-before)
	}
	waitUntil(t, "dropped bytes counted", func() bool { return p.Stats().BytesDropped == int64(len("lost in space")) })

	// The server side is partitioned too: its FIN does not reach the client.
	srv.mu.Lock()
	for _, sc := range srv.conns {
		sc.Close()
	}
	srv.mu.Unlock()
	expectSilent(t, c, 200*time.Millisecond)
	if st := p.Stats(); st.Active != 1 || st.BlackholedConns != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestBlackholeNewConnection(t *testing.T) {
	srv, p := echoProxy(t)
	p.SetMode(Blackhole)
	c := dial(t, p.Addr()) // accepted
	if _, err := c.Write([]byte("anyone?")); err != nil {
		t.Fatal(err)
	}
	expectSilent(t, c, 300*time.Millisecond)
	if n := srv.accepted.Load(); n != 0 {
		t.Fatalf("target saw %d connections during blackhole", n)
	}
	// The client giving up ends the proxied connection.
	c.Close()
	waitUntil(t, "no active connections", func() bool { return p.Stats().Active == 0 })
}

func TestHealAbortsBlackholedConnections(t *testing.T) {
	_, p := echoProxy(t)
	old := pinged(t, p)
	p.SetMode(Blackhole)
	bornDark := dial(t, p.Addr())
	if _, err := old.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "two connections", func() bool { return p.Stats().Active == 2 })

	p.SetMode(Pass)
	for _, c := range []net.Conn{old, bornDark} {
		if err := expectDead(t, c); !isReset(err) {
			t.Fatalf("blackholed connection after heal: want reset, got %v", err)
		}
	}
	fresh := dial(t, p.Addr())
	roundTrip(t, fresh, "healed")
	waitUntil(t, "one connection", func() bool { return p.Stats().Active == 1 })
}

func TestBlackholeThenReset(t *testing.T) {
	_, p := echoProxy(t)
	c := pinged(t, p)
	p.SetMode(Blackhole)
	expectSilent(t, c, 50*time.Millisecond)
	p.SetMode(Reset)
	if err := expectDead(t, c); !isReset(err) {
		t.Fatalf("want reset, got %v", err)
	}
}

func TestTargetResetPropagates(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		sc, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 1)
		_, _ = sc.Read(buf)
		_ = sc.(*net.TCPConn).SetLinger(0)
		sc.Close()
	}()
	p := newProxy(t, ln.Addr().String())
	c := dial(t, p.Addr())
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := expectDead(t, c); !isReset(err) {
		t.Fatalf("want reset propagated from target, got %v", err)
	}
}

func TestDialFailureResetsClient(t *testing.T) {
	// Nothing listens on port 1 here. (A freshly closed ephemeral port could
	// be handed to the proxy's own listener.)
	p := newProxy(t, "127.0.0.1:1")
	dialExpectReset(t, p.Addr())
	waitUntil(t, "dial error counted", func() bool { return p.Stats().DialErrors == 1 })
}

func TestCloseStopsEverything(t *testing.T) {
	srv := newEchoServer(t)
	base := runtime.NumGoroutine()
	p, err := New(srv.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for i := 0; i < 3; i++ {
		c := dial(t, p.Addr())
		roundTrip(t, c, "x")
		conns = append(conns, c)
	}
	p.SetMode(Blackhole)
	conns = append(conns, dial(t, p.Addr()))
	waitUntil(t, "4 connections", func() bool { return p.Stats().Active == 4 })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
	if st := p.Stats(); st.Active != 0 {
		t.Fatalf("active after Close: %+v", st)
	}
	for _, c := range conns {
		if err := expectDead(t, c); err == nil {
			t.Fatal("connection alive after Close")
		}
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("proxy still accepting after Close")
	}
	p.SetMode(Reset) // no-op after Close, must not panic
	// The echo server's goroutines for the closed connections finish too.
	waitUntil(t, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= base+1 })
}

// TestConcurrentModeFlips hammers the proxy with clients while the mode
// flips, for the race detector; every client must finish (no hangs) and the
// proxy must end with no connections.
func TestConcurrentModeFlips(t *testing.T) {
	_, p := echoProxy(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ok atomic.Int64
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 16)
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
				if err != nil {
					continue
				}
				_ = c.SetDeadline(time.Now().Add(100 * time.Millisecond))
				for j := 0; j < 5; j++ {
					if _, err := c.Write([]byte("0123456789abcdef")); err != nil {
						break
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						break
					}
					ok.Add(1)
				}
				c.Close()
			}
		}()
	}
	modes := []Mode{Pass, Blackhole, Pass, Reset, Blackhole, Reset, Pass}
	for round := 0; round < 5; round++ {
		for _, m := range modes {
			p.SetMode(m)
			_ = p.Stats()
			time.Sleep(10 * time.Millisecond) // deliberate: each mode lasts a moment under traffic
		}
	}
	p.SetMode(Pass)
	base := ok.Load()
	waitUntil(t, "a round trip after the last Pass", func() bool { return ok.Load() > base })
	close(stop)
	wg.Wait()
	if ok.Load() == 0 {
		t.Fatal("no round trip ever succeeded")
	}
	waitUntil(t, "no active connections", func() bool { return p.Stats().Active == 0 })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestNewWithListenerAndDial(t *testing.T) {
	srv := newEchoServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var dialed atomic.Int64
	p, err := NewWith("elsewhere:1", Options{Listener: ln, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		dialed.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, srv.ln.Addr().String())
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if p.Addr() != ln.Addr().String() || p.Target() != "elsewhere:1" {
		t.Fatalf("addr %s target %s", p.Addr(), p.Target())
	}
	c := dial(t, p.Addr())
	roundTrip(t, c, "through the caller's dialer")
	if dialed.Load() != 1 {
		t.Fatalf("dial called %d times", dialed.Load())
	}
	p.SetMode(Blackhole)
	c2 := dial(t, p.Addr())
	if _, err := c2.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	expectSilent(t, c2, 100*time.Millisecond)
}
