package sidecar

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/router"
)

// pyWrite connects with psycopg2 (Debian's, on /usr/bin/python3) to the
// DSN a route answer gives, as a Python worker does, retrying for up to
// a minute, writes a row and prints the port of the server that took it.
const pyWrite = `
import os, sys, time, psycopg2
dsn = sys.argv[1]
deadline = time.time() + 60
while True:
    try:
        c = psycopg2.connect(dsn)
        cur = c.cursor()
        cur.execute("CREATE TABLE IF NOT EXISTS py_failover (at timestamptz DEFAULT now())")
        cur.execute("INSERT INTO py_failover DEFAULT VALUES RETURNING inet_server_port()")
        print(cur.fetchone()[0])
        c.commit()
        break
    except psycopg2.Error as e:
        if time.time() > deadline:
            raise
        time.sleep(0.1)
`

// A Python worker with the route's DSN (a group's multi-host DSN with
// target_session_attrs=read-write, no password: libpq's password file
// supplies it) writes to the group's primary, and after the primary's
// SIGKILL to the promoted standby, with no restart and no new DSN.
func TestFaultsPythonFollowsAGroupsPrimary(t *testing.T) {
	testenv.Faults(t)
	testenv.Exclusive(t)
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Fatal("/usr/bin/python3 is required")
	}
	group := testenv.StartPGGroups(t, 1).Nodes[0]
	nodes := clustertest.Nodes(1)
	nodes[0].DSN = group.DSN
	nodes[0].Patroni = bucketmap.Patroni{Namespace: group.PatroniNamespace, Scope: group.PatroniScope}
	m, err := bucketmap.New(0, nodes, t0)
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.NewFromFile(clustertest.WriteMapFile(t, t.TempDir(), m), router.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, body := get(t, Handler(r, HandlerOptions{}), "/v1/route?uid=alice")
	var rt struct {
		DSN   string `json:"dsn"`
		Group string `json:"group"`
	}
	if err := json.Unmarshal([]byte(body), &rt); err != nil || rt.Group != group.PatroniScope || strings.Contains(rt.DSN, group.Password) {
		t.Fatalf("route answer %s", body)
	}
	write := func() string {
		t.Helper()
		cmd := exec.Command("/usr/bin/python3", "-c", pyWrite, rt.DSN)
		cmd.Env = append(cmd.Environ(), "PGPASSFILE="+group.PGPassFile)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("python: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	before := write()
	killed := group.KillPrimary(t)
	start := time.Now()
	after := write()
	t.Logf("python wrote through port %s, then (after %s died) through port %s, %s after the kill", before, killed, after, time.Since(start).Round(100*time.Millisecond))
	if before == after || !strings.HasSuffix(group.Members[0], before) && !strings.HasSuffix(group.Members[1], before) {
		t.Fatalf("ports %q then %q: want two members of %v", before, after, group.Members)
	}
	group.StartMembers(t)
}
