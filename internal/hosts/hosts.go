// Package hosts gives tests hosts of their own on one machine: each host is
// a network namespace with one address, joined by a veth pair to a bridge
// that lives in a sandbox namespace. No host has a route anywhere else, so
// no packet leaves the sandbox: traffic goes to a host's own loopback or
// across the bridge to another host. Partitions are real packet filtering
// (nftables in the hosts' namespaces), and a capture on the bridge
// (tcpdump) sees every packet between hosts (capture.go, streams.go).
//
// It needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), iproute2, nftables and
// tcpdump: scripts/install-deps installs them.
package hosts

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Subnet is the sandbox's network; host k (1-based, in the order added)
// gets 10.231.0.(k+1).
const Subnet = "10.231.0.0/24"

// ErrUnavailable is returned when this machine cannot make namespaces
// (not root, or a tool missing).
var ErrUnavailable = errors.New("hosts: network namespaces are not available")

// Net is a sandbox and its hosts. Its namespaces are named NAME-sandbox and
// NAME-HOST (ip netns), so a crashed run's are found and removed by the
// next New with the same name.
type Net struct {
	name string
	mu   sync.Mutex
	// hosts in the order added (their addresses follow it).
	hosts []*Host
}

// Host is one host: a namespace and its address.
type Host struct {
	Name string
	// Addr is its address on the bridge (10.231.0.x).
	Addr string
	ns   string // the ip netns name
	net  *Net
	f    *os.File // the namespace, for threads that enter it

	cutMu    sync.Mutex
	cutReady bool // its nftables table exists (cut.go)
}

// Available says why this machine cannot make hosts, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root", ErrUnavailable)
	}
	for _, t := range []string{"ip", "nft", "tcpdump"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%w: %s is not installed (scripts/install-deps installs iproute2, nftables and tcpdump)", ErrUnavailable, t)
		}
	}
	return nil
}

// New makes the sandbox namespace NAME-sandbox with its bridge, after
// removing what a crashed run of the same name left.
func New(name string) (*Net, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	n := &Net{name: name}
	n.removeStale()
	if err := run("ip", "netns", "add", n.sandbox()); err != nil {
		return nil, err
	}
	if err := run("ip", "-n", n.sandbox(), "link", "add", "br0", "type", "bridge"); err != nil {
		n.Close()
		return nil, err
	}
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"link", "set", "br0", "up"}} {
		if err := run("ip", append([]string{"-n", n.sandbox()}, args...)...); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// Attach finds the sandbox and hosts that New and Add made (in another
// process: the test binary run again inside a host).
func Attach(name string, hostNames ...string) (*Net, error) {
	n := &Net{name: name}
	for i, hn := range hostNames {
		h := &Host{Name: hn, Addr: hostAddr(i + 1), ns: n.nsName(hn), net: n}
		f, err := os.Open(filepath.Join("/run/netns", h.ns))
		if err != nil {
			return nil, fmt.Errorf("hosts: host %s: %w", hn, err)
		}
		h.f = f
		n.hosts = append(n.hosts, h)
	}
	return n, nil
}

func (n *Net) sandbox() string         { return n.name + "-sandbox" }
func (n *Net) nsName(h string) string  { return n.name + "-" + h }
func hostAddr(k int) string            { return fmt.Sprintf("10.231.0.%d", k+1) }
func (n *Net) hostVeth(h *Host) string { return "v" + strings.TrimPrefix(h.Addr, "10.231.0.") }

// Add makes host name: its namespace, loopback up, eth0 with the next
// address, plugged into the bridge. Hosts reach each other by address;
// nothing else is routed.
func (n *Net) Add(name string) (*Host, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, h := range n.hosts {
		if h.Name == name {
			return nil, fmt.Errorf("hosts: host %s exists", name)
		}
	}
	h := &Host{Name: name, Addr: hostAddr(len(n.hosts) + 1), ns: n.nsName(name), net: n}
	steps := [][]string{
		{"ip", "netns", "add", h.ns},
		{"ip", "link", "add", "name", "eth0", "netns", h.ns, "type", "veth", "peer", "name", n.hostVeth(h), "netns", n.sandbox()},
		{"ip", "-n", n.sandbox(), "link", "set", n.hostVeth(h), "master", "br0", "up"},
		{"ip", "-n", h.ns, "link", "set", "lo", "up"},
		{"ip", "-n", h.ns, "addr", "add", h.Addr + "/24", "dev", "eth0"},
		{"ip", "-n", h.ns, "link", "set", "eth0", "up"},
	}
	for _, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			_ = run("ip", "netns", "del", h.ns)
			return nil, fmt.Errorf("hosts: host %s: %w", name, err)
		}
	}
	f, err := os.Open(filepath.Join("/run/netns", h.ns))
	if err != nil {
		return nil, err
	}
	h.f = f
	n.hosts = append(n.hosts, h)
	return h, nil
}

// Host is the host called name, or nil.
func (n *Net) Host(name string) *Host {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, h := range n.hosts {
		if h.Name == name {
			return h
		}
	}
	return nil
}

// Hosts are the hosts in the order added.
func (n *Net) Hosts() []*Host {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.hosts)
}

// Namespace is the ip netns name of the host (for `ip netns exec`).
func (h *Host) Namespace() string { return h.ns }

// Do runs fn on a thread of its own that entered the host's namespace:
// sockets fn creates, and processes it starts, are the host's. The thread
// is never given back to the runtime (it ends with fn's goroutine), so no
// other goroutine ever runs in the namespace.
func (h *Host) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(h.f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("hosts: enter %s: %w", h.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Start starts cmd on the host: the child is forked by a thread inside the
// namespace, so it (and what it execs) lives there; its pid is its own.
func (h *Host) Start(cmd *exec.Cmd) error { return h.Do(cmd.Start) }

// Dialer dials from the host.
func (h *Host) Dialer() func(network, addr string) (net.Conn, error) {
	return func(network, addr string) (net.Conn, error) {
		var c net.Conn
		err := h.Do(func() (err error) {
			c, err = net.Dial(network, addr)
			return err
		})
		return c, err
	}
}

// Close removes every namespace of the sandbox. Processes still running in
// a host keep its namespace alive but lose its link: stop them first.
func (n *Net) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, h := range n.hosts {
		if h.f != nil {
			h.f.Close()
		}
		_ = run("ip", "netns", "del", h.ns)
	}
	n.hosts = nil
	_ = run("ip", "netns", "del", n.sandbox())
}

// removeStale deletes namespaces named NAME-* that a crashed run left.
func (n *Net) removeStale() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], n.name+"-") {
			_ = run("ip", "netns", "del", f[0])
		}
	}
}

// run runs a tool and returns its output in the error.
func run(name string, args ...string) error {
	_, err := output("", name, args...)
	return err
}

// runIn runs a tool in namespace ns with stdin.
func runIn(ns, stdin, name string, args ...string) error {
	_, err := output(stdin, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
	return err
}

// outputIn is a tool's output in namespace ns.
func outputIn(ns, name string, args ...string) (string, error) {
	return output("", "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

func output(stdin, name string, args ...string) (string, error) {
	var out, errb bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()+out.String()))
	}
	return out.String(), nil
}

// Placement puts each named server on the host of the same name
// (devenv.Placement): zk1 on host zk1, pg1-m2 on host pg1-m2. A server
// without a host of its name has no address ("").
type Placement struct{ Net *Net }

// Addr is the address of the host named server.
func (p Placement) Addr(server string) string {
	if h := p.Net.Host(server); h != nil {
		return h.Addr
	}
	return ""
}

// Start starts cmd on the host named server.
func (p Placement) Start(server string, cmd *exec.Cmd) error {
	h := p.Net.Host(server)
	if h == nil {
		return fmt.Errorf("hosts: no host %s", server)
	}
	return h.Start(cmd)
}

// Subnet is the sandbox's network.
func (p Placement) Subnet() string { return Subnet }
