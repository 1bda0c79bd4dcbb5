package multihost

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/hosts"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// cluster is the suite's deployment: the servers of a TLS dev environment
// placed on their hosts, and shardvisor's binaries run on theirs.
type cluster struct {
	t   *testing.T
	net *hosts.Net
	env *devenv.Env
	dir string
	bin string
	// base is every binary's environment: ZooKeeper and the cluster, and
	// the CA; as() adds a host's identity.
	base []string
}

const (
	zkPortBase = 41811
	pgPortBase = 45432
	appPort    = 18080
	adminPort  = 19080
	routerPort = 19180
	clusterID  = "mh"
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// logWriter sends devenv's progress lines to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newCluster attaches to the hosts TestMain made, starts the bridge's
// capture (before any server: every stream is seen from its SYN), the
// servers on their hosts, and builds the binaries.
func newCluster(t *testing.T) (*cluster, *hosts.Capture) {
	n, err := hosts.Attach(netName, hostNames...)
	if err != nil {
		t.Fatal(err)
	}
	dir := "/tmp/shardvisor-multihost" // traversable by the postgres user; kept for a look after a failure
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// On tmpfs: tcpdump keeps up (capture.go); removed when the test passes.
	pcap := "/dev/shm/shardvisor-multihost-bridge.pcap"
	capt, err := n.Capture(pcap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = capt.Stop() // a second Stop is harmless
		if !t.Failed() {
			os.Remove(pcap)
			os.Remove(pcap + ".log")
		}
	})
	c := &cluster{t: t, net: n, dir: dir, bin: filepath.Join(dir, "bin")}
	c.env = devenv.New(devenv.Config{Dir: filepath.Join(dir, "devenv"), ZKPortBase: zkPortBase, PGPortBase: pgPortBase,
		PGNodes: 2, HA: 2, TLS: true, Hosts: hosts.Placement{Net: n}, Timeout: 180 * time.Second, Log: logWriter{t}})
	t.Cleanup(func() {
		if err := c.env.Down(); err != nil {
			t.Log("devenv down:", err)
		}
	})
	start := time.Now()
	if err := c.env.Up(); err != nil {
		t.Fatal(err)
	}
	t.Logf("servers up on their hosts in %s", time.Since(start).Round(time.Second))
	cmd := exec.Command("go", "build", "-o", c.bin+"/", "./cmd/shardctl", "./cmd/supervisor", "./cmd/router", "./examples/notes", "./examples/notes/loadgen")
	cmd.Dir = repoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ca := c.env.TLSFiles("").CA
	c.base = []string{"SHARDVISOR_ZK=" + c.env.ZKConnect(), "SHARDVISOR_ZK_ROOT=/shardvisor", "SHARDVISOR_CLUSTER=" + clusterID,
		"SHARDVISOR_ZK_TLS_CA=" + ca, "PGSSLMODE=verify-full", "PGSSLROOTCERT=" + ca, "SHARDVISOR_LOG_FORMAT=json",
		// The moves' streams log in by the subscribing server's certificate:
		// no password in any catalog.
		"SHARDVISOR_NODE_STREAM_USER=" + devenv.StreamUser}
	return c, capt
}

// nodeDSN is node i's DSN without its password (the cluster records a
// reference to the password file instead).
func (c *cluster) nodeDSN(i int) string {
	u, err := url.Parse(c.env.NodeDSN(i))
	if err != nil {
		c.t.Fatal(err)
	}
	u.User = url.User(u.User.Username())
	return u.String()
}

// as is the environment of a binary run as identity (admin, web1...).
func (c *cluster) as(identity string) []string {
	f := c.env.TLSFiles(identity)
	return append(append(os.Environ(), c.base...), "SHARDVISOR_ZK_TLS_CERT="+f.Cert, "SHARDVISOR_ZK_TLS_KEY="+f.Key)
}

func (c *cluster) cmd(identity, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.bin, name), args...)
	cmd.Env = c.as(identity)
	return cmd
}

// shardctl runs shardctl as the operator on the operator's host (this
// process's) and returns its standard output; it fails the test on a
// non-zero exit.
func (c *cluster) shardctl(args ...string) string {
	c.t.Helper()
	cmd := c.cmd("admin", "shardctl", args...)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		c.t.Fatalf("shardctl %s: %v\n%s%s", strings.Join(args, " "), err, out, errb.String())
	}
	return string(out)
}

// proc is a binary running on a host.
type proc struct {
	*exec.Cmd
	exited chan struct{}
}

// start runs a binary on host as identity, logging to a file; it is
// stopped (SIGTERM, by pid) at the end of the test.
func (c *cluster) start(host, identity, name string, args ...string) *proc {
	c.t.Helper()
	cmd := c.cmd(identity, name, args...)
	f, err := os.Create(filepath.Join(c.dir, host+"-"+name+".log"))
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := c.net.Host(host).Start(cmd); err != nil {
		c.t.Fatal(err)
	}
	p := &proc{Cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	c.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-p.exited
		}
		f.Close()
	})
	return p
}

// httpOn is a client whose connections start on host (its loopback is the
// host's own).
func (c *cluster) httpOn(host string, tlsCfg *tls.Config) *http.Client {
	dial := c.net.Host(host).Dialer()
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:     func(_ context.Context, network, addr string) (net.Conn, error) { return dial(network, addr) },
		TLSClientConfig: tlsCfg,
	}}
}

// waitOK waits for url to answer 200 through client.
func waitOK(t *testing.T, client *http.Client, url string, limit time.Duration) {
	t.Helper()
	testenv.WaitFor(t, limit, func() bool {
		res, err := client.Get(url)
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == 200
	}, url+" to answer 200")
}

// adminTLS is the operator's client configuration for the supervisors'
// admin endpoints and the sidecar.
func (c *cluster) adminTLS() *tls.Config {
	cfg, err := c.env.TLSFiles("admin").Config()
	if err != nil {
		c.t.Fatal(err)
	}
	return cfg
}

// metric sums the samples of name on a supervisor's admin endpoint.
func metric(client *http.Client, url, name string) (float64, error) {
	res, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			var v float64
			fmt.Sscan(f[1], &v)
			sum += v
		}
	}
	return sum, nil
}

// writePool writes a pool config of the notes app for web head host.
func (c *cluster) writePool(name string, workers int) string {
	p := filepath.Join(c.dir, name+".json")
	b, _ := json.Marshal(map[string]any{
		"version": 1, "command": filepath.Join(c.bin, "notes"), "workers": workers,
		"listen":           []map[string]string{{"name": "http", "addr": fmt.Sprintf("tcp://127.0.0.1:%d", appPort)}},
		"graceful_timeout": "15s",
		"readiness":        map[string]string{"mode": "notify", "timeout": "30s"},
		"map_delivery":     map[string]string{"mode": "reload", "ack_timeout": "5s"},
	})
	if err := os.WriteFile(p, b, 0o644); err != nil {
		c.t.Fatal(err)
	}
	return p
}
