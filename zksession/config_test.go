package zksession

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

func TestParseConnect(t *testing.T) {
	for _, tc := range []struct {
		in      string
		servers []string
		chroot  string
		errHas  string
	}{
		{in: "127.0.0.1:2181", servers: []string{"127.0.0.1:2181"}},
		{in: "a:1, b:2 ,c:3/apps/x", servers: []string{"a:1", "b:2", "c:3"}, chroot: "/apps/x"},
		{in: "a:1/apps/", servers: []string{"a:1"}, chroot: "/apps"},
		{in: "a:1/", servers: []string{"a:1"}},
		{in: "[::1]:2181", servers: []string{"[::1]:2181"}},
		{in: "", errHas: "empty"},
		{in: "a", errHas: `server "a" is not host:port`},
		{in: "a:1,,b:2", errHas: `server "" is not host:port`},
		{in: "a:1//x", errHas: "empty component"},
		{in: "a:1/x/../y", errHas: "relative component"},
	} {
		cs, err := ParseConnect(tc.in)
		if tc.errHas != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("ParseConnect(%q) = %v, want error containing %q", tc.in, err, tc.errHas)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseConnect(%q): %v", tc.in, err)
			continue
		}
		if strings.Join(cs.Servers, ",") != strings.Join(tc.servers, ",") || cs.Chroot != tc.chroot {
			t.Errorf("ParseConnect(%q) = %+v, want servers %v chroot %q", tc.in, cs, tc.servers, tc.chroot)
		}
	}
}

func TestCredentialNeverPrintsPassword(t *testing.T) {
	c, err := ParseCredential("admin:s3cret")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{c.String(), fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s", c, c, c, c), fmt.Sprint(&c)} {
		if strings.Contains(s, "s3cret") {
			t.Fatalf("credential printed its password: %s", s)
		}
	}
	for _, bad := range []string{"", "admin", ":x", "admin:"} {
		if _, err := ParseCredential(bad); err == nil {
			t.Errorf("ParseCredential(%q) accepted", bad)
		}
	}
}

func TestLoadCredential(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "cred")
	if err := os.WriteFile(f, []byte("reader:pw\nignored\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadCredential("", f)
	if err != nil || c.User != "reader" || c.Password != "pw" {
		t.Fatalf("LoadCredential(file) = %v, %v", c, err)
	}
	c, err = LoadCredential("admin:x", f) // the value wins over the file
	if err != nil || c.User != "admin" {
		t.Fatalf("LoadCredential(value, file) = %v, %v", c, err)
	}
	if c, err := LoadCredential("", ""); c != nil || err != nil {
		t.Fatalf("LoadCredential(none) = %v, %v", c, err)
	}
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte("nocolon\n"), 0o600)
	if _, err := LoadCredential("", bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("bad file: err = %v, want it to name the file", err)
	}
	if _, err := LoadCredential("", filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing file accepted")
	}
}

func TestClusterACL(t *testing.T) {
	admin := &Credential{"admin", "a"}
	reader := &Credential{"reader", "r"}
	if acl := ClusterACL(nil, nil); len(acl) != 1 || acl[0].Scheme != "world" || acl[0].Perms != zk.PermAll {
		t.Fatalf("open ACL = %+v", acl)
	}
	acl := ClusterACL(admin, reader)
	if len(acl) != 2 || acl[0].Perms != zk.PermAll || acl[1].Perms != zk.PermRead || acl[1].Scheme != "digest" {
		t.Fatalf("admin+reader ACL = %+v", acl)
	}
	if strings.Contains(acl[0].ID, ":a") || !strings.HasPrefix(acl[0].ID, "admin:") {
		t.Fatalf("digest ACL id should be user:hash, got %q", acl[0].ID)
	}
	acl = ClusterACL(admin, nil)
	if acl[1].Scheme != "world" || acl[1].Perms != zk.PermRead {
		t.Fatalf("admin-only ACL should let the world read: %+v", acl)
	}
	m := MemberACL(admin, reader)
	if m[1].Perms != zk.PermRead|zk.PermCreate|zk.PermDelete || acl[0].Perms != zk.PermAll {
		t.Fatalf("member ACL = %+v", m)
	}
}

func TestValidatePath(t *testing.T) {
	for _, ok := range []string{"/", "/a", "/a/b-c/d.e"} {
		if err := validatePath(ok); err != nil {
			t.Errorf("validatePath(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a", "/a/", "/a//b", "/a/./b", "/.."} {
		if err := validatePath(bad); err == nil {
			t.Errorf("validatePath(%q) accepted", bad)
		}
	}
}

// The sniffer must find the timeout even when the frame arrives one byte
// at a time, and must not alter the bytes.
func TestSniffConnReadsNegotiatedTimeout(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	var got time.Duration
	sc := &sniffConn{Conn: b, onValue: func(d time.Duration) { got = d }}
	frame := make([]byte, 4+4+4+8)
	binary.BigEndian.PutUint32(frame[0:], 16)
	binary.BigEndian.PutUint32(frame[4:], 0)    // protocol version
	binary.BigEndian.PutUint32(frame[8:], 4000) // timeout ms
	binary.BigEndian.PutUint64(frame[12:], 0xabc)
	go func() {
		for _, c := range frame {
			a.Write([]byte{c})
		}
	}()
	buf := make([]byte, 0, len(frame))
	one := make([]byte, 3)
	for len(buf) < len(frame) {
		n, err := sc.Read(one)
		if err != nil {
			t.Fatal(err)
		}
		buf = append(buf, one[:n]...)
	}
	if string(buf) != string(frame) {
		t.Fatal("sniffer altered the stream")
	}
	if got != 4*time.Second {
		t.Fatalf("negotiated timeout = %v, want 4s", got)
	}
}

func TestJitterHostsCyclesAndSignalsRetry(t *testing.T) {
	h := newJitterHosts(10 * time.Millisecond)
	if err := h.Init([]string{"a:1", "b:2", "c:3"}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	retries := 0
	for i := 0; i < 9; i++ {
		s, retry := h.Next()
		seen[s]++
		if retry {
			retries++
		}
	}
	if len(seen) != 3 || seen["a:1"] != 3 {
		t.Fatalf("servers not cycled evenly: %v", seen)
	}
	// 9 calls = 3 passes; every pass after the first starts with a retry.
	if retries != 2 {
		t.Fatalf("retryStart signalled %d times, want 2", retries)
	}
	h.Connected()
	if _, retry := h.Next(); retry {
		t.Fatal("retryStart right after Connected")
	}
	if err := newJitterHosts(time.Second).Init(nil); err == nil {
		t.Fatal("empty server list accepted")
	}
}

// The records identity is derived the same way forever: the records
// readers created are owned by it. The value is what the shell recipe in
// docs/zookeeper-layout.md computes with openssl.
func TestRecordsCredentialIsStable(t *testing.T) {
	admin := Credential{User: "admin", Password: "adm1n"}
	if got := admin.DigestID(); got != "admin:gXBPhcT+j+QG39zuNWErlXGsgo4=" {
		t.Fatalf("digest id %s", got)
	}
	rc, err := RecordsCredential(admin.DigestID())
	if err != nil || rc.User != "admin+records" || rc.Password != "gEHtJQJR4XltRLSeRQKJo0lbpXI_Ne13swvawcb1M7U" {
		t.Fatalf("records identity %s %q: %v", rc.User, rc.Password, err)
	}
	for _, bad := range []string{"admin", "admin:", ":hash", "admin:x"} {
		if _, err := RecordsCredential(bad); err == nil {
			t.Errorf("RecordsCredential(%q) succeeded", bad)
		}
	}
}

// Until the connect response has been read whole, every deadline the
// library sets (go-zookeeper: 10 × 2/3 of the session timeout, and none for
// the rest of the response) is capped at the handshake bound: a server that
// accepts the connection and answers nothing costs the bound, not a minute.
func TestSniffConnBoundsTheHandshake(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	var failed []string
	dial := sniffingDialer(func(string, string, time.Duration) (net.Conn, error) { return b, nil }, dialHooks{
		handshake: func() time.Duration { return 100 * time.Millisecond },
		onFail:    func(addr string) { failed = append(failed, addr) },
	})
	c, err := dial("tcp", "frozen:1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sc := c.(*sniffConn)
	// As the library does: a long deadline, then none, around the read.
	if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 4))
		done <- err
	}()
	select {
	case err := <-done:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("read from a silent server: %v, want a timeout", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handshake read was not bounded")
	}
	if len(failed) != 1 || failed[0] != "frozen:1" || sc.hsDone.Load() {
		t.Fatalf("handshake failures %v, done %v", failed, sc.hsDone.Load())
	}
}

// Once the connect response is read, the library's deadlines pass through
// untouched (a live connection's reads wait as long as it says).
func TestSniffConnHandshakeDoneLiftsTheCap(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	dial := sniffingDialer(func(string, string, time.Duration) (net.Conn, error) { return b, nil }, dialHooks{
		handshake: func() time.Duration { return 50 * time.Millisecond },
	})
	c, _ := dial("tcp", "s:1", time.Second)
	sc := c.(*sniffConn)
	frame := make([]byte, 4+16)
	binary.BigEndian.PutUint32(frame[0:], 16)
	binary.BigEndian.PutUint32(frame[8:], 4000)
	go a.Write(frame)
	buf := make([]byte, len(frame))
	if _, err := io.ReadFull(c, buf[:4]); err != nil {
		t.Fatal(err)
	}
	if sc.hsDone.Load() {
		t.Fatal("handshake done after the length prefix only")
	}
	if _, err := io.ReadFull(c, buf[4:]); err != nil {
		t.Fatal(err)
	}
	if !sc.hsDone.Load() || sc.hsAt.Load() == 0 {
		t.Fatal("handshake not done after the whole connect response")
	}
	want := time.Now().Add(time.Hour)
	if got := sc.capped(want); !got.Equal(want) {
		t.Fatalf("deadline after the handshake %v, want %v", got, want)
	}
	// No deadline left from the handshake: a read now waits for data.
	go func() { time.Sleep(200 * time.Millisecond); a.Write([]byte{1}) }()
	if _, err := c.Read(buf[:1]); err != nil {
		t.Fatalf("read after the handshake: %v", err)
	}
}

// A server the session gave up on is skipped while others are left; when
// every server is avoided, the next one is tried anyway.
func TestJitterHostsAvoid(t *testing.T) {
	h := newJitterHosts(10 * time.Millisecond)
	if err := h.Init([]string{"a:1", "b:2", "c:3"}); err != nil {
		t.Fatal(err)
	}
	first, _ := h.Next()
	h.Connected()
	h.Avoid(first, time.Hour)
	for range 6 {
		if s, _ := h.Next(); s == first {
			t.Fatalf("avoided server %s tried while others are left", s)
		}
	}
	for _, s := range h.servers {
		h.Avoid(s, time.Hour)
	}
	seen := map[string]bool{}
	for range 3 {
		s, _ := h.Next()
		seen[s] = true
	}
	if len(seen) != 3 {
		t.Fatalf("with every server avoided, tried %v", seen)
	}
	// One server: every pass after the first is a retry.
	one := newJitterHosts(10 * time.Millisecond)
	_ = one.Init([]string{"x:1"})
	if _, retry := one.Next(); retry {
		t.Fatal("first try is a retry")
	}
	if _, retry := one.Next(); !retry {
		t.Fatal("second pass over one server is not a retry")
	}
}
