// Package multihost is the suite across hosts: every server on a host of
// its own (internal/hosts: network namespaces on a sandboxed bridge), over
// TLS, with a capture of the bridge read back at the end (the wire check),
// partitions by packet filtering, and the faults of a deployment: a
// primary's host killed, a primary cut from ZooKeeper. It runs in make
// test-faults (SHARDVISOR_FAULTS=1), as root.
//
// The test binary runs itself again inside the operator's host (TestMain):
// its own clients (shardctl, checks) then reach the servers across the
// bridge like any other host's.
package multihost

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/internal/hosts"
)

const (
	// netName prefixes the namespaces (a crashed run's are removed by the
	// next).
	netName = "svmh"
	// insideEnv is set in the run inside the operator's host.
	insideEnv = "SHARDVISOR_MULTIHOST_INSIDE"
)

// hostNames are the hosts, in the order made (their addresses follow it):
// the operator, three ZooKeeper servers, two Patroni groups of two
// members, two web heads.
var hostNames = []string{"op", "zk1", "zk2", "zk3", "pg1-m1", "pg1-m2", "pg2-m1", "pg2-m2", "web1", "web2"}

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(insideEnv) != "" || os.Getenv("SHARDVISOR_FAULTS") != "1" || testing.Short() || hosts.Available() != nil {
		// Inside the operator's host; or not to run (the tests skip).
		os.Exit(m.Run())
	}
	os.Exit(runInside())
}

// runInside makes the hosts, runs this test binary again on the operator's
// host with the same arguments, and removes the hosts.
func runInside() int {
	n, err := hosts.New(netName)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer n.Close()
	for _, h := range hostNames {
		if _, err := n.Add(h); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), insideEnv+"="+strings.Join(hostNames, ","))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := n.Host("op").Start(cmd); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := cmd.Wait(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
