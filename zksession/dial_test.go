package zksession

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// A configured dialer (TLS: its handshake happens inside the dial) gets the
// connect timeout plus the handshake's bound, and a server whose dial timed
// out is reported, to be skipped for a while; the default dialer keeps the
// library's timeout.
func TestSniffingDialerTimeouts(t *testing.T) {
	var got time.Duration
	var failed []string
	hooks := dialHooks{handshake: func() time.Duration { return 1500 * time.Millisecond }, onFail: func(addr string) { failed = append(failed, addr) }}
	timedOut := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	dial := sniffingDialer(func(network, addr string, timeout time.Duration) (net.Conn, error) {
		got = timeout
		return nil, timedOut
	}, hooks)
	if _, err := dial("tcp", "zk1:2281", time.Second); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("dial: %v", err)
	}
	if got != 2500*time.Millisecond {
		t.Errorf("the configured dialer got %s, want 1s + the 1.5s handshake bound", got)
	}
	if len(failed) != 1 || failed[0] != "zk1:2281" {
		t.Errorf("servers reported after a timed-out dial: %v, want zk1:2281", failed)
	}
	refused := sniffingDialer(func(string, string, time.Duration) (net.Conn, error) { return nil, errors.New("connection refused") }, hooks)
	if _, err := refused("tcp", "zk2:2281", time.Second); err == nil || len(failed) != 1 {
		t.Errorf("a refused dial: %v, reported %v; want an error and no report", err, failed)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := sniffingDialer(nil, hooks)("tcp", ln.Addr().String(), time.Second)
	if err != nil {
		t.Fatalf("the default dialer: %v", err)
	}
	c.Close()
}
