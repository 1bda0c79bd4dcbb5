package sidecar

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/router"
)

func python(t *testing.T) string {
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3" // Debian's, with its packages; not a pyenv shim
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("python3 is required under CI")
		}
		t.Skip("python3 not installed")
	}
	return p
}

// pythonPackage is the directory of the Python package (clients/python).
func pythonPackage() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "clients", "python")
}

// pyCommand runs `python3 -m shardvisor ARGS...` from the checkout.
func pyCommand(py string, args ...string) *exec.Cmd {
	cmd := exec.Command(py, append([]string{"-m", "shardvisor"}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pythonPackage(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUTF8=1")
	return cmd
}

// The Python client, through the sidecar and from the map file, agrees
// with the Go router on every user, at one depth and at mixed depths.
func TestPythonClientAgreesWithGo(t *testing.T) {
	py := python(t)
	m, _ := bucketmap.New(7, clustertest.Nodes(5), t0)
	m = clustertest.Next(m)
	if err := m.SetMoving(bucketmap.Bucket{Prefix: 3, Depth: m.Level}, m.Owner(100), "mv-3"); err != nil {
		t.Fatal(err)
	}
	pythonAgrees(t, py, m)
	// Mixed depths 3..9: buckets split at several depths, halves moved
	// apart, and a half in a move's write pause.
	mx := mixedMap(t, clustertest.Nodes(5))
	if mx.Uniform() || mx.MinDepth() != 3 || mx.Level != 9 {
		t.Fatalf("depths %d..%d", mx.MinDepth(), mx.Level)
	}
	pythonAgrees(t, py, mx)
}

func pythonAgrees(t *testing.T, py string, m *bucketmap.Map) {
	dir := t.TempDir()
	mapFile := clustertest.WriteMapFile(t, dir, m)
	r, err := router.NewFromFile(mapFile, router.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(r, HandlerOptions{}))
	defer srv.Close()
	uids := []string{"alice", "bob", "ünïcødé", "user-42@example.com"}
	for i := range 300 {
		uids = append(uids, fmt.Sprintf("u%d", i))
	}
	for _, mode := range [][]string{{"--sidecar", srv.URL}, {"--sidecar", srv.URL, "--batch"}, {"--map-file", mapFile}} {
		cmd := pyCommand(py, append(append([]string{"route"}, mode...), uids...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", mode, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != len(uids) {
			t.Fatalf("%v: %d answers for %d uids", mode, len(lines), len(uids))
		}
		for i, line := range lines {
			var got routeJSON
			if err := json.Unmarshal([]byte(line), &got); err != nil {
				t.Fatalf("%v: %q: %v", mode, line, err)
			}
			want, _ := r.Route(uids[i])
			if got.UID != uids[i] || got.Node != string(want.Node) || got.Bucket != want.Bucket || got.Level != want.Level || got.MapVersion != want.MapVersion || got.State != string(want.State) {
				t.Fatalf("%v: %s -> %+v, Go says %+v", mode, uids[i], got, want)
			}
		}
	}
	if m.Uniform() {
		return
	}
	// Every bucket of a mixed map is some user's, and every depth shows.
	seen := map[int]bool{}
	for _, u := range uids {
		rt, _ := r.Route(u)
		seen[rt.Level] = true
	}
	if len(seen) < 3 {
		t.Fatalf("the users tested reach only depths %v", seen)
	}
	// Errors from the sidecar reach the Python caller as a clear message.
	cmd := pyCommand(py, "route", "--sidecar", srv.URL, strings.Repeat("x", MaxUIDLen+1))
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "400") || !strings.Contains(string(out), "1025 bytes") {
		t.Fatalf("too-long uid through Python: %v %s", err, out)
	}
	cmd = pyCommand(py, "route", "--sidecar", "http://127.0.0.1:1", "a")
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "cannot reach") {
		t.Fatalf("unreachable sidecar: %v %s", err, out)
	}
}
