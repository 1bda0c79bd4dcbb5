package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// runPool runs shardctl's pool commands in this process.
func runPool(t *testing.T, z *testenv.ZK, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := newApp()
	app.Writer, app.ErrWriter = &out, &out
	cliMu.Lock()
	defer cliMu.Unlock()
	err := app.Run(append([]string{"shardctl", "--zk", z.ConnectString, "--zk-root", z.Root, "--cluster", "c1", "--log-level", "error"}, args...))
	return out.String(), err
}

func TestIntegrationPoolSetGetStatus(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	os.WriteFile(good, []byte(`{"version":1,"command":"/bin/app","workers":2,"listen":[{"name":"http","addr":"tcp://127.0.0.1:8080"}]}`), 0o644)
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"version":1,"command":"/bin/app","workers":2,"graceful_timout":"3s"}`), 0o644)

	if out, err := runPool(t, z, "pool", "status", "web"); err != nil || !strings.Contains(out, "no config") {
		t.Fatalf("status of a new pool: %q %v", out, err)
	}
	if _, err := runPool(t, z, "pool", "set", "web", "--file", bad); err == nil || !strings.Contains(err.Error(), `unknown field "graceful_timout"`) || !strings.Contains(err.Error(), "nothing written") {
		t.Fatalf("invalid config: %v", err)
	}
	if out, err := runPool(t, z, "pool", "set", "web", "--file", good); err != nil || !strings.Contains(out, "created") {
		t.Fatalf("set: %q %v", out, err)
	}
	out, err := runPool(t, z, "pool", "get", "web")
	if err != nil || !strings.Contains(out, `"command": "/bin/app"`) {
		t.Fatalf("get: %q %v", out, err)
	}
	if out, err := runPool(t, z, "pool", "set", "web", "--file", good); err != nil || !strings.Contains(out, "version 1") {
		t.Fatalf("second set: %q %v", out, err)
	}
	if _, err := runPool(t, z, "pool", "set", "web", "--file", good, "--expect-version", "0"); err == nil || !strings.Contains(err.Error(), "changed (expected version 0)") {
		t.Fatalf("stale --expect-version: %v", err)
	}
	out, err = runPool(t, z, "--json", "pool", "status", "web")
	if err != nil {
		t.Fatal(err)
	}
	var rep poolStatusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.ConfigVersion == nil || *rep.ConfigVersion != 1 || len(rep.Members) != 0 {
		t.Fatalf("status --json %q: %+v %v", out, rep, err)
	}

	// A member back from a whole-ensemble outage reports the episode.
	ss := zktest.Session(t, zksession.Config{Connect: z.ConnectString})
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	fs := &topo.FailStatic{Since: since, Until: since.Add(21 * time.Second), Peers: 2}
	if _, err := topo.RegisterPoolMember(context.Background(), ss, topo.MustPaths(z.Root, "c1"), "web",
		topo.PoolMember{Version: topo.PoolMemberVersion, Member: "m1", State: "serving", FailStatic: fs}); err != nil {
		t.Fatal(err)
	}
	out, err = runPool(t, z, "pool", "status", "web")
	if err != nil || !strings.Contains(out, "last fail-static episode: 2026-01-02T03:04:05Z to 2026-01-02T03:04:26Z (21s, 2 peers agreed)") {
		t.Fatalf("status of a member back from fail-static: %q %v", out, err)
	}
}
