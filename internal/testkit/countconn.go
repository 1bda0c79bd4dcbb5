package testkit

import (
	"net"
	"sync/atomic"
	"time"
)

// CountingConn counts in N the bytes read from the connection: what a
// server really sent, for a test or a benchmark that weighs a protocol on
// the wire.
type CountingConn struct {
	net.Conn
	N *atomic.Int64
}

func (c CountingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.N.Add(int64(n))
	return n, err
}

// CountingDial dials as net.DialTimeout does (zksession.Config.Dial's
// signature) and counts the connection's bytes read in n.
func CountingDial(n *atomic.Int64) func(network, addr string, timeout time.Duration) (net.Conn, error) {
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return CountingConn{c, n}, nil
	}
}
