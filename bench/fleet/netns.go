package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardvisor/shardvisor/internal/faultproxy"
)

// The isolated host: one supervisor runs in a network namespace of its
// own, where 127.0.0.1 is a loopback nobody else is on. Everything it may
// reach is a faultproxy listening inside that namespace on the very
// address of the real thing (each ZooKeeper server, each db node, each
// peer supervisor's admin address, as published in the member records)
// and dialling it from outside. Its own admin address is proxied the other
// way, so peers reach it too. Blackholing the ZooKeeper and peer proxies
// isolates it from ZooKeeper and from its peers, and from nothing else:
// its workers still reach PostgreSQL, and the load balancer (this program,
// dialling into the namespace) still sees its port and /healthz.

// netns is a network namespace held open by a sleeping process.
type netns struct {
	holder *proc
	f      *os.File
}

func newNetns(ps *procs) (*netns, error) {
	h, err := ps.start("netns-holder", []string{"unshare", "--net", "--", "sh", "-c",
		"ip link set lo up && echo up >" + ps.logDir + "/netns.up && exec sleep 2147483647"}, childEnv())
	if err != nil {
		return nil, err
	}
	upFile := ps.logDir + "/netns.up"
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(upFile); err == nil && len(b) > 0 {
			break
		}
		if !h.alive() || time.Now().After(deadline) {
			ps.stop([]*proc{h}, unix.SIGKILL, time.Second)
			out, _ := os.ReadFile(h.log)
			return nil, fmt.Errorf("network namespace (unshare --net needs CAP_SYS_ADMIN): %s", strings.TrimSpace(string(out)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = os.Remove(upFile)
	f, err := os.Open("/proc/" + strconv.Itoa(h.pid()) + "/ns/net")
	if err != nil {
		return nil, err
	}
	return &netns{holder: h, f: f}, nil
}

// do runs fn on a fresh goroutine locked to its thread, moved into the
// namespace. The thread is never unlocked, so it exits with the goroutine
// and no other goroutine ever runs in the namespace. Sockets keep the
// namespace they were created in, wherever they are used later.
func (n *netns) do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func (n *netns) listen(addr string) (net.Listener, error) {
	var ln net.Listener
	err := n.do(func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// dial connects from inside the namespace.
func (n *netns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// nsenter is the argv prefix that runs a command in the namespace.
func (n *netns) nsenter() []string {
	return []string{"nsenter", "--net=/proc/" + strconv.Itoa(n.holder.pid()) + "/ns/net", "--"}
}

func (n *netns) close() { n.f.Close() }

// isolation is the isolated host's proxies.
type isolation struct {
	ns    *netns
	zk    []*faultproxy.Proxy // inside, on each ZooKeeper address
	pg    []*faultproxy.Proxy // inside, on each db node's address (never cut)
	peers []*faultproxy.Proxy // inside, on each other supervisor's admin address
	back  *faultproxy.Proxy   // outside, on the isolated supervisor's admin address
}

// newIsolation sets up the proxies before the supervisor starts.
func newIsolation(ns *netns, zkAddrs, pgAddrs, peerAdmins []string, ownAdmin string) (*isolation, error) {
	iso := &isolation{ns: ns}
	inside := func(addr string) (*faultproxy.Proxy, error) {
		ln, err := ns.listen(addr)
		if err != nil {
			return nil, err
		}
		return faultproxy.NewWith(addr, faultproxy.Options{Listener: ln})
	}
	for _, group := range []struct {
		addrs []string
		into  *[]*faultproxy.Proxy
	}{{zkAddrs, &iso.zk}, {pgAddrs, &iso.pg}, {peerAdmins, &iso.peers}} {
		for _, a := range group.addrs {
			p, err := inside(a)
			if err != nil {
				iso.close()
				return nil, fmt.Errorf("proxy for %s inside the namespace: %w", a, err)
			}
			*group.into = append(*group.into, p)
		}
	}
	ln, err := net.Listen("tcp", ownAdmin)
	if err != nil {
		iso.close()
		return nil, fmt.Errorf("proxy for the isolated admin address %s: %w", ownAdmin, err)
	}
	if iso.back, err = faultproxy.NewWith(ownAdmin, faultproxy.Options{Listener: ln, Dial: ns.dial}); err != nil {
		iso.close()
		return nil, err
	}
	return iso, nil
}

// set puts the ZooKeeper and peer proxies (both directions) in mode m.
func (iso *isolation) set(m faultproxy.Mode) {
	for _, p := range append(append([]*faultproxy.Proxy{iso.back}, iso.zk...), iso.peers...) {
		p.SetMode(m)
	}
}

func (iso *isolation) close() {
	for _, p := range append(append(append([]*faultproxy.Proxy{iso.back}, iso.zk...), iso.pg...), iso.peers...) {
		if p != nil {
			p.Close()
		}
	}
}
