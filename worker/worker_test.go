package worker

import (
	"context"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testkit"
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

// notifySocket listens on a NOTIFY_SOCKET of the test's own (set in the
// environment) and returns its reader: the next message within wait, or
// false if none came.
func notifySocket(t *testing.T) func(wait time.Duration) (workerproto.Message, bool) {
	t.Helper()
	sock, msgs := testkit.NotifySocket(t)
	t.Setenv(workerproto.EnvNotifySocket, sock)
	return func(wait time.Duration) (workerproto.Message, bool) {
		select {
		case m := <-msgs:
			return workerproto.ParseMessage([]byte(m)), true
		case <-time.After(wait):
			return workerproto.Message{}, false
		}
	}
}

// Notify and the watchdog speak workerproto's sd_notify.
func TestNotifyAndWatchdog(t *testing.T) {
	read := notifySocket(t)
	t.Setenv(workerproto.EnvWatchdogUSec, "20000")
	t.Setenv(workerproto.EnvWatchdogPID, strconv.Itoa(os.Getpid()))
	if err := Notify(workerproto.Ready); err != nil {
		t.Fatal(err)
	}
	if m, ok := read(5 * time.Second); !ok || !m.Ready {
		t.Fatalf("got %+v (%v), want READY=1", m, ok)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { watchdog(ctx); close(done) }()
	if m, ok := read(5 * time.Second); !ok || !m.Watchdog {
		t.Fatalf("got %+v (%v), want WATCHDOG=1", m, ok)
	}
	cancel()
	<-done
}

// The request count goes to the supervisor as REQUESTS=N, cumulative,
// only when it changed, at most once per interval.
func TestReportRequests(t *testing.T) {
	read := notifySocket(t)
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
