package devenv

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"
)

// Placement puts each server on a host of its own (internal/hosts: a
// network namespace with an address). Config.Hosts nil is this host: every
// server on 127.0.0.1, as always.
//
// Servers are named zkI (ZooKeeper server I), pgI (plain node I) and
// pgI-mM (member M of group I); webI names web head I, which devenv does
// not run but whose certificate must name its address.
type Placement interface {
	// Addr is the address server listens on and is reached at; "" for a
	// server the placement has no host for.
	Addr(server string) string
	// Start starts cmd on server's host.
	Start(server string, cmd *exec.Cmd) error
	// Subnet is the network the hosts share (pg_hba's address range).
	Subnet() string
}

// addr is server's address.
func (e *Env) addr(server string) string {
	if e.c.Hosts != nil {
		if a := e.c.Hosts.Addr(server); a != "" {
			return a
		}
	}
	return "127.0.0.1"
}

// hostPort is server's address with port.
func (e *Env) hostPort(server string, port int) string {
	return net.JoinHostPort(e.addr(server), strconv.Itoa(port))
}

// serverIPs are the addresses a server certificate of server names.
func (e *Env) serverIPs(server string) []net.IP {
	ips := []net.IP{net.IPv4(127, 0, 0, 1)}
	if a := e.addr(server); a != "127.0.0.1" {
		ips = append(ips, net.ParseIP(a))
	}
	return ips
}

// clientCIDR is what pg_hba takes TCP clients from.
func (e *Env) clientCIDR() string {
	if e.c.Hosts != nil {
		return e.c.Hosts.Subnet()
	}
	return "127.0.0.1/32"
}

// startOn is startDaemon on server's host.
func (e *Env) startOn(server string, cmd *exec.Cmd, out *os.File) (int, error) {
	if e.c.Hosts == nil {
		return startDaemon(cmd, out)
	}
	return startDaemonWith(cmd, out, func() error { return e.c.Hosts.Start(server, cmd) })
}

// runPGOn is runPG on server's host (pg_ctl start: the postmaster it forks
// stays on the host).
func (e *Env) runPGOn(server, logFile, name string, args ...string) error {
	if e.c.Hosts == nil {
		return runPG(logFile, name, args...)
	}
	cmd, closeLog, err := pgCommand(logFile, name, args...)
	if err != nil {
		return err
	}
	defer closeLog()
	if err := e.c.Hosts.Start(server, cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// portBusy reports whether something accepts TCP connections on server's
// address at port.
func (e *Env) portBusy(server string, port int) bool {
	c, err := net.DialTimeout("tcp", e.hostPort(server, port), 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// portFreed waits up to wait for server's port to be free and says
// whether it is. A SIGKILLed JVM's main thread can be gone (what waitGone
// sees) while its other threads still hold its sockets for a moment.
func (e *Env) portFreed(server string, port int, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for e.portBusy(server, port) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// runOn runs cmd to completion on server's host.
func (e *Env) runOn(server string, cmd *exec.Cmd) error {
	if e.c.Hosts == nil {
		return cmd.Run()
	}
	if err := e.c.Hosts.Start(server, cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// memberNames are the names group i's members may have (pgI-m1..).
func memberNames(i int) []string {
	out := make([]string, MaxMembers)
	for m := range out {
		out[m] = MemberName(i, m+1)
	}
	return out
}
