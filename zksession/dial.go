package zksession

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/internal/backoff"
)

// sniffConn passes bytes through untouched and reads the session timeout out
// of the first frame the server sends, which on a fresh connection is always
// the connect response: int32 length, int32 protocolVersion, int32 timeOut,
// int64 sessionId, ... The library keeps that value private.
type sniffConn struct {
	net.Conn
	head    [12]byte
	n       int
	onValue func(time.Duration)
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.n < len(c.head) && n > 0 {
		k := copy(c.head[c.n:], p[:n])
		c.n += k
		if c.n == len(c.head) {
			ms := int32(binary.BigEndian.Uint32(c.head[8:12]))
			if ms > 0 {
				c.onValue(time.Duration(ms) * time.Millisecond)
			}
		}
	}
	return n, err
}

func sniffingDialer(dial func(network, addr string, timeout time.Duration) (net.Conn, error), onTimeout func(time.Duration)) func(network, addr string, timeout time.Duration) (net.Conn, error) {
	if dial == nil {
		dial = net.DialTimeout
	}
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := dial(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return &sniffConn{Conn: c, onValue: onTimeout}, nil
	}
}

// jitterHosts is a zk.HostProvider that shuffles the servers and, after a
// full pass without a connection, sleeps a random extra pause (growing up to
// max, each drawn at random from zero to its step) so that a fleet of clients
// does not reconnect in lockstep after an ensemble restart. The library adds
// its own fixed 1 s pause.
type jitterHosts struct {
	mu      sync.Mutex
	servers []string
	curr    int
	last    int
	pauses  *backoff.Backoff
}

func newJitterHosts(max time.Duration) *jitterHosts {
	// Jitter 1 draws from [0, 2d]: steps of 50 ms up to max/2 give pauses
	// from [0, 100 ms] up to [0, max].
	return &jitterHosts{pauses: &backoff.Backoff{Initial: 50 * time.Millisecond, Max: max / 2, Jitter: 1}}
}

func (h *jitterHosts) Init(servers []string) error {
	if len(servers) == 0 {
		return fmt.Errorf("no zookeeper servers")
	}
	h.servers = append([]string(nil), servers...)
	rand.Shuffle(len(h.servers), func(i, j int) { h.servers[i], h.servers[j] = h.servers[j], h.servers[i] })
	h.curr, h.last = -1, -1
	return nil
}

func (h *jitterHosts) Len() int { return len(h.servers) }

func (h *jitterHosts) Next() (string, bool) {
	h.mu.Lock()
	h.curr = (h.curr + 1) % len(h.servers)
	retryStart := h.curr == h.last
	if h.last == -1 {
		h.last = 0
	}
	var pause time.Duration
	if retryStart {
		pause = h.pauses.Next()
	}
	s := h.servers[h.curr]
	h.mu.Unlock()
	if pause > 0 {
		time.Sleep(pause)
	}
	return s, retryStart
}

func (h *jitterHosts) Connected() {
	h.mu.Lock()
	h.last = h.curr
	h.pauses.Reset()
	h.mu.Unlock()
}

// zapLogger routes the library's Printf logs to zap. Routine connection
// chatter goes to debug; failures to warn.
type zapLogger struct{ l *zap.Logger }

func (z zapLogger) Printf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	lower := strings.ToLower(msg)
	if strings.Contains(lower, "fail") || strings.Contains(lower, "error") {
		z.l.Warn(msg, zap.String("source", "go-zookeeper"))
		return
	}
	z.l.Debug(msg, zap.String("source", "go-zookeeper"))
}
