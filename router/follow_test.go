package router

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/testkit"
	"github.com/shardvisor/shardvisor/workerproto"
)

// The map-file source in the supervisor's reload mode: the file is
// replaced in place (by rename, as the supervisor does); the router loads
// each new version, acknowledges it with MAPVERSION=N on NOTIFY_SOCKET,
// and refuses a file that would take it back to an older map.
func TestFromWorkerEnvFollowsTheMapFileInReloadMode(t *testing.T) {
	dir := t.TempDir()
	sock, acks := testkit.NotifySocket(t)
	m1, _ := bucketmap.New(4, clustertest.Nodes(2), t0)
	live := filepath.Join(dir, "live-map.json")
	replace := func(m *bucketmap.Map) {
		t.Helper()
		src := clustertest.WriteMapFile(t, dir, m)
		if err := os.Rename(src, live); err != nil {
			t.Fatal(err)
		}
	}
	replace(m1)
	t.Setenv(workerproto.EnvMapFile, live)
	t.Setenv(workerproto.EnvMapDelivery, workerproto.MapDeliveryReload)
	t.Setenv(workerproto.EnvMapSignal, "SIGUSR1")
	t.Setenv(workerproto.EnvNotifySocket, sock)
	r, err := FromWorkerEnv(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	waitAck := func(want string) {
		t.Helper()
		testkit.Await(t, acks, 10*time.Second, fmt.Sprintf("%q on NOTIFY_SOCKET", want), func(a string) bool { return a == want })
	}
	waitAck("MAPVERSION=1")

	m2 := clustertest.Next(m1)
	to := m2.Nodes()[0].ID
	if m2.Owner(3) == to {
		to = m2.Nodes()[1].ID
	}
	if err := m2.SetMoving(bucketmap.Bucket{Prefix: 3, Depth: m2.Level}, to, "mv-3"); err != nil {
		t.Fatal(err)
	}
	replace(m2)
	waitAck("MAPVERSION=2")
	if r.Map().Version != 2 || r.Map().Meta(3).State != bucketmap.BucketMoving {
		t.Fatalf("router routes by map %d after the file changed", r.Map().Version)
	}

	// The signal makes it look again at once (and acknowledge again).
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitAck("MAPVERSION=2")

	// An older map is refused and not acknowledged; the router keeps 2.
	replace(m1)
	testenv.WaitFor(t, 10*time.Second, func() bool {
		e := r.Stats().LastError.Load()
		return e != nil && strings.Contains(*e, "older than the applied 2")
	}, "the older map file to be refused")
	if r.Map().Version != 2 {
		t.Fatalf("router went back to map %d", r.Map().Version)
	}
	select {
	case a := <-acks:
		t.Fatalf("acknowledged %q for a refused file", a)
	case <-time.After(300 * time.Millisecond):
	}
}

// Without reload mode in the environment the file is read once, as before.
func TestNewFromFileWithoutReloadModeDoesNotFollow(t *testing.T) {
	dir := t.TempDir()
	m1, _ := bucketmap.New(4, clustertest.Nodes(2), t0)
	p := clustertest.WriteMapFile(t, dir, m1)
	t.Setenv(workerproto.EnvMapDelivery, "")
	r, err := NewFromFile(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	src := clustertest.WriteMapFile(t, dir, clustertest.Next(m1))
	if err := os.Rename(src, p); err != nil {
		t.Fatal(err)
	}
	// deliberate: nothing must happen for three poll intervals.
	time.Sleep(3 * workerproto.MapPollInterval)
	if r.Map().Version != 1 {
		t.Fatalf("a file outside reload mode was followed: map %d", r.Map().Version)
	}
}
