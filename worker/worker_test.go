package worker

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/workerproto"
)

func TestListenerFallback(t *testing.T) {
	t.Setenv(workerproto.EnvListenPID, "")
	ln, err := Listener("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if _, err := Listener(""); err == nil {
		t.Fatal("no inherited socket and no fallback: want an error")
	}
}

// Notify and the watchdog speak workerproto's sd_notify.
func TestNotifyAndWatchdog(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Setenv(workerproto.EnvNotifySocket, sock)
	t.Setenv(workerproto.EnvWatchdogUSec, "20000")
	t.Setenv(workerproto.EnvWatchdogPID, strconv.Itoa(os.Getpid()))
	read := func() workerproto.Message {
		buf := make([]byte, 256)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := c.ReadFromUnix(buf)
		if err != nil {
			t.Fatal(err)
		}
		return workerproto.ParseMessage(buf[:n])
	}
	if err := Notify(workerproto.Ready); err != nil {
		t.Fatal(err)
	}
	if m := read(); !m.Ready {
		t.Fatalf("got %+v, want READY=1", m)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { watchdog(ctx); close(done) }()
	if m := read(); !m.Watchdog {
		t.Fatalf("got %+v, want WATCHDOG=1", m)
	}
	cancel()
	<-done
}

// The request count goes to the supervisor as REQUESTS=N, cumulative,
// only when it changed, at most once per interval.
func TestReportRequests(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Setenv(workerproto.EnvNotifySocket, sock)
	read := func(wait time.Duration) (workerproto.Message, bool) {
		buf := make([]byte, 256)
		_ = c.SetReadDeadline(time.Now().Add(wait))
		n, _, err := c.ReadFromUnix(buf)
		if err != nil {
			return workerproto.Message{}, false
		}
		return workerproto.ParseMessage(buf[:n]), true
	}
	var n atomic.Uint64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { reportRequests(ctx, &n, 10*time.Millisecond); close(done) }()
	n.Add(3)
	if m, ok := read(5 * time.Second); !ok || m.Requests != 3 {
		t.Fatalf("got %+v (%v), want REQUESTS=3", m, ok)
	}
	// Unchanged: nothing for ten intervals (a sleep-free check: the read
	// below would get any report sent meanwhile first).
	if m, ok := read(100 * time.Millisecond); ok {
		t.Fatalf("an unchanged count was reported again: %+v", m)
	}
	n.Add(1000)
	if m, ok := read(5 * time.Second); !ok || m.Requests != 1003 {
		t.Fatalf("got %+v (%v), want REQUESTS=1003 (cumulative)", m, ok)
	}
	cancel()
	<-done
}
