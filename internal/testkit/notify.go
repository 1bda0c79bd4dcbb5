package testkit

import (
	"net"
	"path/filepath"
	"testing"
)

// NotifySocket listens on a unixgram socket in a directory of the test's
// own, as a service manager listens on its NOTIFY_SOCKET, and returns the
// socket's path and the messages that arrive on it, in order. The socket
// closes when the test ends.
func NotifySocket(t testing.TB) (path string, msgs <-chan string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan string, 64)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			select {
			case ch <- string(buf[:n]):
			case <-stop:
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		c.Close()
		<-done
	})
	return path, ch
}
