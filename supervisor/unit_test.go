package supervisor

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
)

func TestParseNotify(t *testing.T) {
	m := workerproto.ParseMessage([]byte("READY=1\nSTATUS=booted ok\nWATCHDOG=1"))
	if !m.Ready || !m.Watchdog || m.Status != "booted ok" || m.Stopping {
		t.Fatalf("%+v", m)
	}
	if m := workerproto.ParseMessage([]byte("READY=0")); m.Ready {
		t.Fatal("READY=0 counted as ready")
	}
}

func TestBackoffBounds(t *testing.T) {
	mc := newMachine(machineConfig{jitter: 0.2}, zap.NewNop(), newMetrics(nil))
	b := topo.Backoff{Initial: topo.Duration(100 * time.Millisecond), Max: topo.Duration(2 * time.Second)}
	for n := 1; n < 20; n++ {
		d := mc.backoff(b, n)
		want := 100 * time.Millisecond << (n - 1)
		if want > 2*time.Second || want <= 0 {
			want = 2 * time.Second
		}
		if d < want*8/10 || d > want*12/10 {
			t.Fatalf("backoff(%d) = %s, want %s ±20%%", n, d, want)
		}
	}
}

func TestWorkerEnv(t *testing.T) {
	env := workerEnv([]string{"PATH=/bin", "NOTIFY_SOCKET=/run/systemd/notify", "LISTEN_FDS=2", "A=old", "WATCHDOG_USEC=5"}, map[string]string{"A": "new", "B": "b"})
	got := strings.Join(env, " ")
	if got != "PATH=/bin A=new B=b" {
		t.Fatalf("env %q: the supervisor's own service-manager variables must not leak, config env must win", got)
	}
}

func TestMapVersionAndFiles(t *testing.T) {
	m, err := bucketmap.New(3, []bucketmap.Node{{ID: "n1", DSN: "postgres://h/d", Weight: 1, State: bucketmap.NodeActive}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := bucketmap.Encode(m)
	cl := &topo.ClusterRecord{Name: "c1", Seed: "5eed0000000000000000000000000001"}
	v, doc, err := MapDocument(cl, "/m", raw)
	if err != nil || v != 1 {
		t.Fatalf("%d %v", v, err)
	}
	rec, err := bucketmap.DecodeMapFile("", doc)
	if err != nil || rec.Seed != cl.Seed || rec.Cluster != "c1" || string(rec.Map) != string(raw) {
		t.Fatalf("map file %s: %v", doc, err)
	}
	// A compressed record gives workers the same document, byte for byte:
	// the map in its plain form, for readers in any language.
	m.Encoding = bucketmap.MapGzip
	packed, _ := bucketmap.Encode(m)
	if v, doc2, err := MapDocument(cl, "/m", packed); err != nil || v != 1 || string(doc2) != string(doc) {
		t.Fatalf("map file of the gzip record (%v): %s", err, doc2)
	}
	if _, _, err := MapDocument(cl, "/m", packed[:len(packed)-1]); err == nil || !strings.Contains(err.Error(), "bucket map at /m") {
		t.Errorf("MapDocument of a truncated gzip record: %v", err)
	}
	for _, bad := range []string{`{}`, `[]`, `{"version":1,"map_version":7}`, `not json`} {
		if _, _, err := MapDocument(cl, "/m", []byte(bad)); err == nil {
			t.Errorf("MapDocument(%s) accepted", bad)
		}
	}
	dir := t.TempDir()
	p, err := writeMapFile(dir, 3, []byte("three"))
	if err != nil || filepath.Base(p) != "map-3.json" {
		t.Fatal(p, err)
	}
	if _, err := writeMapFile(dir, 4, []byte("four")); err != nil {
		t.Fatal(err)
	}
	removed := removeMapFiles(dir, map[uint64]bool{4: true})
	if len(removed) != 1 || removed[0] != "map-3.json" {
		t.Fatalf("removed %v", removed)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("left %v (no temp files may remain)", ents)
	}
}

func TestUnixSocketStaleAndInUse(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.sock")
	b, err := bindSocket("unix://" + p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bindSocket("unix://" + p); err == nil || !strings.Contains(err.Error(), "another process is listening") {
		t.Fatalf("second bind: %v", err)
	}
	b.close()
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("socket file not removed: %v", err)
	}
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := bindSocket("unix://" + p); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("bind over a regular file: %v", err)
	}
}

// The supervisor's copy of a bound socket is not watched by Go's network
// poller: otherwise every connection a worker accepts would wake the
// supervisor too. It is blocking (the systemd convention), close-on-exec
// (only the workers' ExtraFiles get it), and still listening.
func TestBoundSocketIsNotPolled(t *testing.T) {
	for _, addr := range []string{"tcp://127.0.0.1:0", "unix://" + filepath.Join(t.TempDir(), "s.sock")} {
		b, err := bindSocket(addr)
		if err != nil {
			t.Fatal(err)
		}
		fd := int(b.file.Fd())
		for _, ep := range epollFDs(t) {
			info, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", ep))
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(info), "\n") {
				if f := strings.Fields(line); len(f) > 1 && f[0] == "tfd:" && f[1] == strconv.Itoa(fd) {
					t.Errorf("%s: fd %d is registered with epoll fd %d: %s", addr, fd, ep, line)
				}
			}
		}
		if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK != 0 {
			t.Errorf("%s: non-blocking (flags %#x, %v)", addr, fl, err)
		}
		if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
			t.Errorf("%s: close-on-exec not set (%#x, %v)", addr, fl, err)
		}
		// Still listening: a connection is queued in its backlog.
		l, err := net.FileListener(b.file)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.DialTimeout(l.Addr().Network(), l.Addr().String(), time.Second)
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		c.Close()
		l.Close()
		b.close()
	}
}

func epollFDs(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		if dst, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.Contains(dst, "eventpoll") {
			n, _ := strconv.Atoi(e.Name())
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		t.Fatal("no epoll fd in this process: the check would prove nothing")
	}
	return out
}
