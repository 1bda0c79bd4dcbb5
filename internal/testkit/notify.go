package testkit

import (
	"net"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Notification is one datagram on a NotifySocket: its text and the pid
// of the process that sent it, as the kernel attached it (SO_PASSCRED),
// which is how a service manager knows who said what.
type Notification struct {
	PID  int
	Text string
}

// Fields are the message's lines, KEY=VALUE each.
func (n Notification) Fields() []string { return strings.Split(n.Text, "\n") }

// Get is the value the message gives key ("" when it gives none).
func (n Notification) Get(key string) string {
	for _, f := range n.Fields() {
		if k, v, ok := strings.Cut(f, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// Has reports whether the message sets key to value.
func (n Notification) Has(key, value string) bool {
	for _, f := range n.Fields() {
		if f == key+"="+value {
			return true
		}
	}
	return false
}

// NotifySocket listens on a unixgram socket in a directory of the test's
// own, as a service manager listens on its NOTIFY_SOCKET, and returns the
// socket's path and the messages that arrive on it, in order. The socket
// closes when the test ends.
func NotifySocket(t testing.TB) (path string, msgs <-chan string) {
	t.Helper()
	ch := make(chan string, 64)
	path = listenNotify(t, func(n Notification, stop <-chan struct{}) bool {
		select {
		case ch <- n.Text:
			return true
		case <-stop:
			return false
		}
	})
	return path, ch
}

// NotifySocketFrom is NotifySocket with each message's sender.
func NotifySocketFrom(t testing.TB) (path string, msgs <-chan Notification) {
	t.Helper()
	ch := make(chan Notification, 256)
	path = listenNotify(t, func(n Notification, stop <-chan struct{}) bool {
		select {
		case ch <- n:
			return true
		case <-stop:
			return false
		}
	})
	return path, ch
}

// listenNotify reads the socket until the test ends or deliver returns
// false.
func listenNotify(t testing.TB, deliver func(n Notification, stop <-chan struct{}) bool) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
		for {
			n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			msg := Notification{Text: string(buf[:n])}
			if scms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, scm := range scms {
					if cred, err := unix.ParseUnixCredentials(&scm); err == nil {
						msg.PID = int(cred.Pid)
					}
				}
			}
			if !deliver(msg, stop) {
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		c.Close()
		<-done
	})
	return path
}
