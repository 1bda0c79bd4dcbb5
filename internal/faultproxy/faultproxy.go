// Package faultproxy is a TCP proxy for tests that can pass traffic, reset
// connections, or silently swallow traffic (a network partition) on demand.
//
// A test points the code under test at Proxy.Addr() instead of the real
// server and flips the mode with SetMode:
//
//   - Pass: bytes are forwarded both ways; half-closes (FIN) and resets are
//     propagated to the other side.
//   - Reset: every open connection is aborted with a TCP RST (SO_LINGER 0) on
//     both the client and the target side; new connections are accepted and
//     reset at once (the client sees "connection reset by peer").
//   - Blackhole: sockets stay open but bytes read from either side are
//     dropped, as are FINs; new connections are accepted but the target is
//     never dialled. To the client this looks like a partition in which
//     packets vanish: writes succeed, nothing ever comes back.
//
// Healing a partition (Blackhole -> Pass) aborts, with RST on both sides,
// every connection that was blackholed, and lets new connections pass. The
// proxy has already thrown away the bytes it swallowed, so resuming such a
// connection would hand the peer a byte stream with a hole in it, which real
// TCP never does; in a real partition long enough to matter the endpoints'
// timeouts (session expiry, keepalives) end the connection too. Clients are
// expected to reconnect, which is what the tests want to exercise.
//
// Bytes a connection read just before a mode change may still be delivered
// (at most one read buffer per direction): the mode applies to bytes read
// after SetMode returns.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardvisor/shardvisor/internal/backoff"
)

// Mode is what the proxy does with traffic.
type Mode int32

const (
	// Pass forwards traffic in both directions.
	Pass Mode = iota
	// Reset aborts all connections with RST and resets new ones immediately.
	Reset
	// Blackhole keeps connections open and silently drops all traffic.
	Blackhole
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Reset:
		return "reset"
	case Blackhole:
		return "blackhole"
	}
	return fmt.Sprintf("Mode(%d)", int32(m))
}

// Stats are cumulative counters since New, except Active.
type Stats struct {
	Accepted        int64 // client connections accepted
	Active          int64 // client connections currently open
	BytesToTarget   int64 // bytes forwarded client -> target
	BytesToClient   int64 // bytes forwarded target -> client
	BytesDropped    int64 // bytes swallowed while blackholed (both directions)
	Resets          int64 // connections aborted by the proxy (Reset mode, partition heal, dial failure)
	DialErrors      int64 // failed dials to the target
	BlackholedConns int64 // connections that were ever blackholed
}

// Proxy is a fault-injecting TCP proxy. Its methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	ctx    context.Context // cancelled by Close; aborts dials
	cancel context.CancelFunc

	mu     sync.Mutex
	mode   Mode
	conns  map[*conn]struct{}
	closed bool

	wg sync.WaitGroup

	accepted, active, toTarget, toClient, dropped, resets, dialErrors, blackholed atomic.Int64
}

// DialTimeout bounds the proxy's dial to the target.
const DialTimeout = 5 * time.Second

// New starts a proxy to target ("host:port") listening on 127.0.0.1 on a
// free port, in Pass mode.
func New(target string) (*Proxy, error) {
	return NewWith(target, Options{})
}

// Options let a caller choose where the proxy listens and how it reaches
// the target: the fleet benchmark puts a proxy's listener inside a network
// namespace (where the isolated process lives) on the very address of the
// server it stands for, and dials from outside it.
type Options struct {
	// Listener to accept on (default: a new one on 127.0.0.1, free port).
	// The proxy owns it from now on and closes it with Close.
	Listener net.Listener
	// Dial reaches the target (default: a net.Dialer with DialTimeout).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// NewWith is New with Options.
func NewWith(target string, o Options) (*Proxy, error) {
	ln := o.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("faultproxy: listen: %w", err)
		}
	}
	dial := o.Dial
	if dial == nil {
		d := net.Dialer{Timeout: DialTimeout}
		dial = d.DialContext
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target: target,
		ln:     ln,
		dial:   dial,
		ctx:    ctx,
		cancel: cancel,
		conns:  make(map[*conn]struct{}),
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's listening address, "127.0.0.1:PORT".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// SetMode switches the mode and applies it to the open connections before it
// returns (see the package comment for what each transition does).
func (p *Proxy) SetMode(m Mode) {
	if m != Pass && m != Reset && m != Blackhole {
		panic(fmt.Sprintf("faultproxy: invalid mode %d", int32(m)))
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.mode = m
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		switch m {
		case Reset:
			c.abort(true)
		case Blackhole:
			c.blackhole()
		case Pass:
			if c.state.Load() == stateBlackhole {
				c.abort(true)
			}
		}
	}
}

// Stats returns a snapshot of the counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		Accepted:        p.accepted.Load(),
		Active:          p.active.Load(),
		BytesToTarget:   p.toTarget.Load(),
		BytesToClient:   p.toClient.Load(),
		BytesDropped:    p.dropped.Load(),
		Resets:          p.resets.Load(),
		DialErrors:      p.dialErrors.Load(),
		BlackholedConns: p.blackholed.Load(),
	}
}

// Close stops listening, closes every connection (without RST) and waits for
// all of the proxy's goroutines to finish. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.cancel()
	err := p.ln.Close()
	for _, c := range conns {
		c.abort(false)
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	retry := backoff.New(5*time.Millisecond, time.Second)
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (e.g. EMFILE): back off a little and retry.
			if retry.Wait(p.ctx) != nil {
				return
			}
			continue
		}
		retry.Reset()
		p.accepted.Add(1)

		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			nc.Close()
			return
		}
		mode := p.mode
		c := &conn{p: p, client: nc}
		switch mode {
		case Reset:
			p.mu.Unlock()
			p.resets.Add(1)
			setLinger0(nc)
			nc.Close()
			continue
		case Blackhole:
			c.state.Store(stateBlackhole)
			p.blackholed.Add(1)
		default:
			c.state.Store(statePass)
		}
		p.conns[c] = struct{}{}
		p.active.Add(1)
		p.wg.Add(1)
		p.mu.Unlock()
		go c.run(mode)
	}
}

const (
	statePass int32 = iota
	stateBlackhole
	stateDead
)

type conn struct {
	p      *Proxy
	client net.Conn
	state  atomic.Int32

	mu       sync.Mutex
	upstream net.Conn // nil until dialled (never set in a connection born blackholed)
}

// run dials the target (unless the connection was born blackholed) and pumps
// bytes until both directions are finished or the connection is aborted.
func (c *conn) run(mode Mode) {
	defer c.p.wg.Done()
	defer c.finish()

	if mode == Blackhole {
		c.pump(c.client, nil, &c.p.dropped)
		return
	}

	dctx, cancel := context.WithTimeout(c.p.ctx, DialTimeout)
	up, err := c.p.dial(dctx, "tcp", c.p.target)
	cancel()
	if err != nil {
		c.p.dialErrors.Add(1)
		c.abort(true) // the client sees a reset, like a refused connection
		return
	}
	c.mu.Lock()
	if c.state.Load() == stateDead {
		c.mu.Unlock()
		up.Close()
		return
	}
	c.upstream = up
	c.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.pump(up, c.client, &c.p.toClient)
	}()
	c.pump(c.client, up, &c.p.toTarget)
	wg.Wait()
}

// pump copies src to dst while the connection passes, drops what it reads
// while it is blackholed, and returns when src is finished or the connection
// is aborted. dst is nil for a connection born blackholed.
func (c *conn) pump(src, dst net.Conn, counter *atomic.Int64) {
	buf := make([]byte, 32*1024)
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			switch c.state.Load() {
			case statePass:
				if _, werr := dst.Write(buf[:n]); werr != nil {
					if c.state.Load() == statePass {
						// The other side is gone: abort, as a router would not.
						c.abort(true)
					}
					return
				}
				counter.Add(int64(n))
			case stateBlackhole:
				c.p.dropped.Add(int64(n))
			default:
				return
			}
		}
		if rerr == nil {
			continue
		}
		switch c.state.Load() {
		case statePass:
			if errors.Is(rerr, io.EOF) {
				// Propagate the half-close.
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			} else {
				// A reset (or other error) on one side: reset the other.
				c.abort(true)
			}
		case stateBlackhole:
			// A FIN or RST during a partition is lost like everything else;
			// this direction is just finished.
		}
		return
	}
}

// blackhole switches a passing connection to dropping traffic.
func (c *conn) blackhole() {
	if c.state.CompareAndSwap(statePass, stateBlackhole) {
		c.p.blackholed.Add(1)
	}
}

// abort closes both sockets, with RST when rst is set. Safe to call many times.
func (c *conn) abort(rst bool) {
	c.mu.Lock()
	prev := c.state.Swap(stateDead)
	up := c.upstream
	c.mu.Unlock()
	if prev == stateDead {
		return
	}
	if rst {
		c.p.resets.Add(1)
		setLinger0(c.client)
		if up != nil {
			setLinger0(up)
		}
	}
	c.client.Close()
	if up != nil {
		up.Close()
	}
}

// finish runs once, when the connection's goroutines are done.
func (c *conn) finish() {
	c.mu.Lock()
	c.state.Store(stateDead)
	up := c.upstream
	c.mu.Unlock()
	c.client.Close()
	if up != nil {
		up.Close()
	}
	c.p.mu.Lock()
	delete(c.p.conns, c)
	c.p.mu.Unlock()
	c.p.active.Add(-1)
}

func setLinger0(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}
