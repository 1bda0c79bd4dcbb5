package worker

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
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
