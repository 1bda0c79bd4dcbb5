package supervisor

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// SdNotify sends state ("READY=1", "STOPPING=1", ...) to the socket in
// NOTIFY_SOCKET, as systemd's sd_notify(3) does. It returns false, nil when
// NOTIFY_SOCKET is unset (not running under a notify-aware manager). A path
// starting with '@' is an abstract socket.
func SdNotify(state string) (bool, error) {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return false, nil
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("sd_notify to %s: %w", addr, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("sd_notify to %s: %w", addr, err)
	}
	return true, nil
}

// notifySocket is the NOTIFY_SOCKET of one worker.
//
// Each worker gets its own socket, in the abstract namespace (no file to
// clean up, no path-length limit from a long state directory), named with
// a random part. Whatever arrives on it is that worker's, whichever process
// of the worker's tree sent it: a forking server such as gunicorn may send
// READY=1 from the master or a child. Identifying senders by
// SCM_CREDENTIALS pid on one shared socket would reject such servers.
type notifySocket struct {
	conn *net.UnixConn
	addr string // "@shardvisor/..."
}

func listenNotify(prefix string) (*notifySocket, error) {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	addr := "@" + prefix + "/" + hex.EncodeToString(rnd[:])
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("notify socket %s: %w", addr, err)
	}
	return &notifySocket{conn: conn, addr: addr}, nil
}

// notifyMsg is what one datagram said.
type notifyMsg struct {
	ready, watchdog, stopping, reloading bool
	status                               string
}

func parseNotify(b []byte) notifyMsg {
	var m notifyMsg
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "READY":
			m.ready = v == "1"
		case "WATCHDOG":
			m.watchdog = v == "1"
		case "STOPPING":
			m.stopping = v == "1"
		case "RELOADING":
			m.reloading = v == "1"
		case "STATUS":
			m.status = v
		}
	}
	return m
}

// read delivers messages until the socket is closed.
func (n *notifySocket) read(deliver func(notifyMsg)) {
	buf := make([]byte, 4096)
	for {
		k, _, err := n.conn.ReadFromUnix(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		deliver(parseNotify(buf[:k]))
	}
}

func (n *notifySocket) close() { _ = n.conn.Close() }
