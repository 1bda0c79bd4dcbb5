package zksession

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/internal/backoff"
)

// sniffConn passes bytes through untouched and reads the session timeout out
// of the first frame the server sends, which on a fresh connection is always
// the connect response: int32 length, int32 protocolVersion, int32 timeOut,
// int64 sessionId, ... The library keeps that value private.
//
// It also bounds the handshake. go-zookeeper gives the connect request and
// the first 4 bytes of its response 10 × 2/3 of the session timeout (70 s
// at 10 s), and the rest of the response no deadline at all; a server that
// accepts TCP but answers nothing (SIGSTOPped: the kernel still completes
// the connect) would hold the session that long. Until the connect
// response has been read whole, every deadline the library sets is capped
// at hsUntil, and one is set at dial time for the read that has none.
type sniffConn struct {
	net.Conn
	addr    string
	head    [12]byte
	n       int // bytes of the connect response read so far
	need    int // its length with the length prefix; 0 until known
	hsDone  atomic.Bool
	hsUntil time.Time
	// hsAt is when the handshake completed (unix ns; 0 until then).
	hsAt      atomic.Int64
	abandoned atomic.Bool // closed by the session: the server stopped answering
	onValue   func(time.Duration)
	onFail    func(addr string) // a handshake that timed out
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.hsDone.Load() {
		return n, err
	}
	if c.n < len(c.head) && n > 0 {
		k := copy(c.head[c.n:], p[:n])
		if c.n < 4 && c.n+k >= 4 {
			c.need = 4 + int(binary.BigEndian.Uint32(c.head[0:4]))
		}
		if c.n < len(c.head) && c.n+k == len(c.head) {
			ms := int32(binary.BigEndian.Uint32(c.head[8:12]))
			if ms > 0 && c.onValue != nil {
				c.onValue(time.Duration(ms) * time.Millisecond)
			}
		}
	}
	c.n += n
	if c.need > 0 && c.n >= c.need {
		// The handshake is done: the library's own deadlines rule from
		// here (it sets one on every read and write of a live connection).
		c.hsDone.Store(true)
		c.hsAt.Store(time.Now().UnixNano())
		_ = c.Conn.SetDeadline(time.Time{})
	}
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() && !c.hsDone.Load() && c.onFail != nil {
		c.onFail(c.addr)
	}
	return n, err
}

func (c *sniffConn) capped(t time.Time) time.Time {
	if c.hsDone.Load() || c.hsUntil.IsZero() {
		return t
	}
	if t.IsZero() || t.After(c.hsUntil) {
		return c.hsUntil
	}
	return t
}

func (c *sniffConn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.capped(t)) }
func (c *sniffConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.capped(t))
}
func (c *sniffConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.capped(t))
}

// dialHooks is what the session learns from each connection.
type dialHooks struct {
	onTimeout func(time.Duration)  // the negotiated session timeout
	handshake func() time.Duration // the bound of one handshake (0: none)
	onConn    func(*sniffConn)     // a new connection, before its handshake
	onFail    func(addr string)    // a handshake timed out
}

func sniffingDialer(dial func(network, addr string, timeout time.Duration) (net.Conn, error), h dialHooks) func(network, addr string, timeout time.Duration) (net.Conn, error) {
	custom := dial != nil
	if !custom {
		dial = net.DialTimeout
	}
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		// A configured dialer (TLS) does its handshake inside the dial,
		// within the library's fixed 1 s connect timeout: a busy server
		// (an ensemble just restarted, every client at once) took longer,
		// and each host retried for minutes while its peers got through.
		// It gets the connect timeout plus the handshake's own bound, and a
		// server that timed out is skipped for a while like one whose
		// connect response timed out.
		if custom && h.handshake != nil {
			timeout += h.handshake()
		}
		c, err := dial(network, addr, timeout)
		var ne net.Error
		if err != nil && custom && errors.As(err, &ne) && ne.Timeout() && h.onFail != nil {
			h.onFail(addr)
		}
		if err != nil {
			return nil, err
		}
		sc := &sniffConn{Conn: c, addr: addr, onValue: h.onTimeout, onFail: h.onFail}
		if h.handshake != nil {
			if d := h.handshake(); d > 0 {
				sc.hsUntil = time.Now().Add(d)
				_ = c.SetDeadline(sc.hsUntil)
			}
		}
		if h.onConn != nil {
			h.onConn(sc)
		}
		return sc, nil
	}
}

// jitterHosts is a zk.HostProvider that shuffles the servers and, after a
// full pass without a connection, sleeps a random extra pause (growing up to
// max, each drawn at random from zero to its step) so that a fleet of clients
// does not reconnect in lockstep after an ensemble restart. The library adds
// its own fixed 1 s pause.
//
// A server the session gave up on (it stopped answering, or a handshake
// with it timed out) is skipped for a while (Avoid): a frozen server still
// accepts TCP connections, and going back to it would cost a handshake
// timeout each pass.
type jitterHosts struct {
	mu      sync.Mutex
	servers []string
	curr    int
	last    int
	pauses  *backoff.Backoff
	avoid   map[string]time.Time // server -> until when it is skipped
}

func newJitterHosts(max time.Duration) *jitterHosts {
	// Jitter 1 draws from [0, 2d]: steps of 50 ms up to max/2 give pauses
	// from [0, 100 ms] up to [0, max].
	return &jitterHosts{pauses: &backoff.Backoff{Initial: 50 * time.Millisecond, Max: max / 2, Jitter: 1}, avoid: map[string]time.Time{}}
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

// Avoid skips server for d, unless every other server is skipped too.
func (h *jitterHosts) Avoid(server string, d time.Duration) {
	h.mu.Lock()
	h.avoid[server] = time.Now().Add(d)
	h.mu.Unlock()
}

func (h *jitterHosts) Next() (string, bool) {
	h.mu.Lock()
	now := time.Now()
	n := len(h.servers)
	// The next server not avoided; if all are, simply the next one.
	pick := (h.curr + 1) % n
	for k := 1; k <= n; k++ {
		i := (h.curr + k) % n
		if !h.avoid[h.servers[i]].After(now) {
			pick = i
			break
		}
	}
	// A retry starts when this pass reaches the server last connected
	// (a full pass without a connection).
	retryStart := false
	for i := h.curr; ; {
		i = (i + 1) % n
		if i == h.last {
			retryStart = true
		}
		if i == pick {
			break
		}
	}
	h.curr = pick
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
	delete(h.avoid, h.servers[h.curr])
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
