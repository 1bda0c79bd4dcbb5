package hosts

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/pki"
)

// TestHostsCaptureAndCut makes three hosts and checks what the wire check
// and the partitions rest on: hosts reach each other by address across
// the bridge; a plain stream's marker is found in the capture and the
// stream is classified plain; a TLS stream's marker is not found and the
// stream starts with TLS; a cut drops packets both ways (a dial times out,
// nothing refuses it) and a heal lets them through again.
func TestHostsCaptureAndCut(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	n, err := New("svhtest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	a, errA := n.Add("a")
	b, errB := n.Add("b")
	c, errC := n.Add("c")
	if err := errors.Join(errA, errB, errC); err != nil {
		t.Fatal(err)
	}
	// The capture goes where a failed run left one of its own, owned by
	// the tcpdump user, in a sticky world-writable directory like
	// /dev/shm: a new capture replaces it (fs.protected_regular would
	// refuse to open it).
	dir := filepath.Join(t.TempDir(), "shm")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "bridge.pcap")
	if err := os.WriteFile(stale, []byte("a failed run's capture"), 0o644); err != nil {
		t.Fatal(err)
	}
	if u, err := user.Lookup("tcpdump"); err == nil {
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(stale, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	capt, err := n.Capture(stale)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = capt.Stop() }) // on a failure too: no tcpdump left behind

	ca, err := pki.NewCA("hosts test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.Identity{Role: "test", Host: "b", IPs: []net.IP{net.ParseIP(b.Addr)}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srvCert := tls.Certificate{Certificate: [][]byte{leaf.Cert.Raw}, PrivateKey: leaf.Key}
	// b serves a plain echo on 7000 and a TLS echo on 7001.
	var plainL, tlsL net.Listener
	if err := b.Do(func() (err error) {
		if plainL, err = net.Listen("tcp", b.Addr+":7000"); err != nil {
			return err
		}
		tlsL, err = tls.Listen("tcp", b.Addr+":7001", &tls.Config{Certificates: []tls.Certificate{srvCert}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, l := range []net.Listener{plainL, tlsL} {
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				go func() { defer conn.Close(); _, _ = io.Copy(conn, conn) }()
			}
		}()
	}
	echo := func(conn net.Conn, msg string) {
		t.Helper()
		defer conn.Close()
		if _, err := conn.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, got); err != nil || string(got) != msg {
			t.Fatalf("echo: %q, %v", got, err)
		}
	}
	plainConn, err := a.Dialer()("tcp", b.Addr+":7000")
	if err != nil {
		t.Fatal(err)
	}
	echo(plainConn, "marker-in-clear-0001")
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	raw, err := a.Dialer()("tcp", b.Addr+":7001")
	if err != nil {
		t.Fatal(err)
	}
	echo(tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: b.Addr}), "marker-in-tls-0002")
	// A host has no route out of the sandbox: an address beyond the
	// bridge is unreachable at once.
	if err := a.Do(func() error {
		conn, err := net.DialTimeout("tcp", "192.0.2.1:80", time.Second)
		if err == nil {
			conn.Close()
			return errors.New("host a reached an address outside the sandbox")
		}
		if !strings.Contains(err.Error(), "unreachable") {
			return errors.New("want network unreachable, got " + err.Error())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	if err := Cut(c, b); err != nil {
		t.Fatal(err)
	}
	if got := c.Cuts(); !strings.Contains(got, b.Addr) {
		t.Fatalf("c's cut set: %s", got)
	}
	if err := c.Do(func() error {
		conn, err := net.DialTimeout("tcp", b.Addr+":7000", 500*time.Millisecond)
		if err == nil {
			conn.Close()
			return errors.New("c reached b through a cut")
		}
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			return errors.New("a cut must drop, not refuse: " + err.Error())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// a is not cut from b.
	conn, err := a.Dialer()("tcp", b.Addr+":7000")
	if err != nil {
		t.Fatal(err)
	}
	echo(conn, "still fine")
	if err := Heal(c, b); err != nil {
		t.Fatal(err)
	}
	conn, err = c.Dialer()("tcp", b.Addr+":7000")
	if err != nil {
		t.Fatal("after heal:", err)
	}
	echo(conn, "healed")

	out, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Log(out)
	rep, err := Analyze(capt.File, map[string][]byte{"plain": []byte("marker-in-clear-0001"), "tls": []byte("marker-in-tls-0002")})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range rep.ByPort(map[string]string{a.Addr: "a", b.Addr: "b", c.Addr: "c"}) {
		t.Log(l)
	}
	// Echoed: once each way.
	if rep.Found["plain"] != 2 || rep.Found["tls"] != 0 {
		t.Fatalf("found %v, want plain 2 (each way), tls 0", rep.Found)
	}
	if rep.Count(StartTLS) != 1 || rep.Count(StartPlain) != 3 || rep.Count(StartUnseen) != 0 {
		for _, s := range rep.Streams {
			t.Log(s)
		}
		t.Fatalf("tls %d plain %d unseen %d streams, want 1, 3 (a's 2, c's after the heal), 0", rep.Count(StartTLS), rep.Count(StartPlain), rep.Count(StartUnseen))
	}
	if !bytes.HasPrefix(rep.Bad()[0].Head, []byte("marker")) {
		t.Fatalf("bad stream head %q", rep.Bad()[0].Head)
	}
	if _, err := os.Stat(capt.File); err != nil {
		t.Fatal(err)
	}
}
