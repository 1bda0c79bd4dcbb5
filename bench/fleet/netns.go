package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardvisor/shardvisor/internal/faultproxy"
)

// The isolated host: one supervisor runs in a network namespace of its
// own (a loopback nobody else is on), where a faultproxy listens on the
// very address of everything it may reach (ZooKeeper servers, db nodes,
// peers' published admin addresses) and dials it from outside; its own
// admin address is proxied the other way. Blackholing all but the db
// nodes' cuts it off from ZooKeeper and its peers only: its workers still
// reach PostgreSQL, and the load balancer still sees its port and /healthz.

// netns is a network namespace held open by a sleeping process.
type netns struct {
	holder *proc
	f      *os.File
}

func newNetns(ps *procs) (*netns, error) {
	upFile := ps.logDir + "/netns.up"
	h, err := ps.start("netns-holder", "unshare", "--net", "--", "sh", "-c", "ip link set lo up && echo up >"+upFile+" && exec sleep 2147483647")
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(upFile); err == nil && len(b) > 0 {
			break
		}
		if !h.alive() || time.Now().After(deadline) {
			ps.stop([]*proc{h}, unix.SIGKILL, time.Second)
			out, _ := os.ReadFile(h.log)
			return nil, fmt.Errorf("network namespace (unshare --net needs CAP_SYS_ADMIN): %s", strings.TrimSpace(string(out)))
		}
	}
	_ = os.Remove(upFile)
	f, err := os.Open("/proc/" + strconv.Itoa(h.pid()) + "/ns/net")
	if err != nil {
		return nil, err
	}
	return &netns{holder: h, f: f}, nil
}

// inNetns runs fn on a fresh goroutine locked to its thread, moved into
// the namespace. The thread is never unlocked, so it exits with the
// goroutine and no other goroutine ever runs in the namespace. Sockets
// keep the namespace they were created in, wherever they are used later.
func inNetns[T any](n *netns, fn func() (T, error)) (T, error) {
	var v T
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if err = unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNET); err != nil {
			err = fmt.Errorf("setns: %w", err)
			return
		}
		v, err = fn()
	}()
	<-done
	return v, err
}

// dial connects from inside the namespace.
func (n *netns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return inNetns(n, func() (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, network, addr) })
}

// nsenter is the argv prefix that runs a command in the namespace.
func (n *netns) nsenter() []string {
	return []string{"nsenter", "--net=/proc/" + strconv.Itoa(n.holder.pid()) + "/ns/net", "--"}
}

func (n *netns) close() { n.f.Close() }

// isolation is the isolated host's proxies (above).
type isolation struct {
	all []*faultproxy.Proxy
	cut []*faultproxy.Proxy // all but the db nodes': blackholed to isolate
}

// newIsolation sets up the proxies before supervisor 0 starts.
func newIsolation(ns *netns, zkAddrs, pgAddrs []string) (*isolation, error) {
	iso := &isolation{}
	addrs := slices.Concat(zkAddrs, pgAddrs)
	for i := range *supervisors {
		addrs = append(addrs, adminAddr(i))
	}
	for _, a := range addrs {
		listen := func() (net.Listener, error) { return net.Listen("tcp", a) }
		var opts faultproxy.Options
		var err error
		if a == adminAddr(0) { // its own: listened on outside, dialled into the namespace
			opts.Listener, err = listen()
			opts.Dial = ns.dial
		} else {
			opts.Listener, err = inNetns(ns, listen)
		}
		var p *faultproxy.Proxy
		if err == nil {
			p, err = faultproxy.NewWith(a, opts)
		}
		if err != nil {
			iso.close()
			return nil, fmt.Errorf("proxy for %s (the isolated host's view): %w", a, err)
		}
		iso.all = append(iso.all, p)
		if !slices.Contains(pgAddrs, a) {
			iso.cut = append(iso.cut, p)
		}
	}
	return iso, nil
}

// set puts the ZooKeeper and peer proxies (both directions) in mode m.
func (iso *isolation) set(m faultproxy.Mode) {
	for _, p := range iso.cut {
		p.SetMode(m)
	}
}

func (iso *isolation) close() {
	for _, p := range iso.all {
		p.Close()
	}
}
