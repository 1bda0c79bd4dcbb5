package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// A node with a pooler: status shows the pooler as its admin console
// says (a node without one shows none), and node check weighs the fleet's
// worst case against the pooler's client limit, warning without failing
// once the supervisors' workers could open more.
func TestIntegrationStatusAndCheckReadThePooler(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	cmd := clusterCmd(z, "pools")
	for _, n := range pg.Nodes {
		if _, err := n.Conn(t).Exec(context.Background(), `CREATE SCHEMA app; CREATE TABLE app.events (bkey bigint NOT NULL, id bigint NOT NULL, PRIMARY KEY (bkey, id))`); err != nil {
			t.Fatal(err)
		}
	}
	mustData(t, cmd("init", "--level", "2", "--seed", seed, "--password", "file:"+pg.Nodes[0].PasswordFile,
		"--node", "pg1="+pg.Nodes[0].DSN, "--node", "pg2="+pg.Nodes[1].DSN, "--pool", "pg1="+pg.Nodes[0].PoolDSN)...)
	prepareTable(t, cmd, "app.events", 2)

	var st struct {
		Pools map[string]struct {
			Poolers []struct {
				Clients, ClientLimit int
				Mode                 string
			} `json:"poolers"`
		} `json:"pools"`
	}
	out := mustData(t, cmd("status", "--json")...)
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	if p, ok := st.Pools["pg1"]; !ok || len(p.Poolers) != 1 || p.Poolers[0].Mode != "transaction" || len(st.Pools) != 1 {
		t.Fatalf("status --json pools: %s", out)
	}
	if out := mustData(t, cmd("status")...); !strings.Contains(out, "pooler of pg1 at 127.0.0.1:") || !strings.Contains(out, "transaction mode") {
		t.Fatalf("status:\n%s", out)
	}

	type budget struct {
		Connections int    `json:"connections"`
		Accepts     int    `json:"accepts"`
		Via         string `json:"via"`
		Over        bool   `json:"over"`
		Error       string `json:"error"`
	}
	check := func(id string) (budget, string) {
		t.Helper()
		r := runData(t, cmd("node", "check", id, "--json")...)
		var out struct {
			Budget budget `json:"connection_budget"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != 0 {
			t.Fatalf("node check %s: exit %d %v\n%s%s", id, r.code, err, r.stdout, r.stderr)
		}
		return out.Budget, mustData(t, cmd("node", "check", id)...)
	}
	if b, _ := check("pg1"); b.Error != "" || b.Accepts != 2000 || !strings.HasPrefix(b.Via, "pooler") || b.Connections != 0 || b.Over {
		t.Fatalf("pg1's budget without supervisors: %+v", b)
	}
	if b, _ := check("pg2"); b.Error != "" || b.Accepts < 100 || !strings.HasPrefix(b.Via, "server") || b.Over {
		t.Fatalf("pg2's budget (no pooler): %+v", b)
	}

	// Two supervisors of a pool of 600 workers (surge 600 too): 2 × 1200
	// × 2 connections at worst, more than either node takes.
	pool := filepath.Join(t.TempDir(), "pool.json")
	if err := os.WriteFile(pool, []byte(`{"version": 1, "command": "/bin/true", "workers": 600}`), 0o644); err != nil {
		t.Fatal(err)
	}
	mustData(t, cmd("pool", "set", "web", "--file", pool)...)
	s := zktest.Session(t, zksession.Config{Connect: z.ConnectString})
	p := topo.MustPaths(z.Root, "pools")
	for _, m := range []string{"web1", "web2"} {
		r, err := topo.RegisterPoolMember(context.Background(), s, p, "web", topo.PoolMember{Version: 1, Member: m, State: "serving"})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Remove(context.Background())
	}
	b, text := check("pg1")
	if b.Connections != 2*1200*2 || !b.Over || !strings.Contains(text, "WARNING node pg1: the fleet may open 4800 connections") || !strings.Contains(text, "max_client_conn") {
		t.Fatalf("pg1 over budget: %+v\n%s", b, text)
	}
	if b, text := check("pg2"); !b.Over || !strings.Contains(text, "--pool-dsn") {
		t.Fatalf("pg2 over budget: %+v\n%s", b, text)
	}
}
