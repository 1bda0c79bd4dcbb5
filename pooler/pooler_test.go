package pooler

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
)

// A node's pooler as its admin console reports it: the clients a test
// holds open in transactions count as clients and each holds a server
// connection; the limits and the mode are the devenv pooler's.
func TestIntegrationReadNode(t *testing.T) {
	pg := testenv.StartPGNodes(t, 1)
	pn := pg.Nodes[0]
	n := bucketmap.Node{ID: "pg1", DSN: pn.DSN, PoolDSN: pn.PoolDSN, Password: "file:" + pn.PasswordFile, Weight: 1, State: bucketmap.NodeActive}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const held = 5
	for range held {
		c, err := pgx.Connect(ctx, pn.PoolDSNWithPassword+"&default_query_exec_mode=cache_describe")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	st, err := ReadNode(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Poolers) != 1 || len(st.Errors) != 0 {
		t.Fatalf("poolers %+v errors %v", st.Poolers, st.Errors)
	}
	p := st.Poolers[0]
	if p.Addr != net.JoinHostPort(pn.Host, strconv.Itoa(pn.PoolPort)) || p.Clients < held || p.Servers < held || p.Mode != "transaction" ||
		p.ClientLimit != 2000 || p.ServerLimit != 40 || p.Waiting != 0 {
		t.Fatalf("pooler state %+v, want %d clients and servers at least, limits 2000/40, transaction mode", p, held)
	}
	if c, w, s := st.Clients(); c != p.Clients || w != 0 || s != p.Servers {
		t.Fatalf("sums %d %d %d of %+v", c, w, s, p)
	}
	if Accepts(st) != 2000 {
		t.Fatalf("accepts %d", Accepts(st))
	}

	// sslmode=prefer (libpq's default) against a plain pooler: pgx lists
	// the address twice, TLS then plain; the second attempt is the one.
	if strings.Contains(pn.PoolDSN, "sslmode=disable") {
		m := n
		m.PoolDSN = strings.Replace(pn.PoolDSN, "sslmode=disable", "sslmode=prefer", 1)
		if st, err := ReadNode(ctx, m); err != nil || len(st.Poolers) != 1 {
			t.Fatalf("sslmode=prefer: %+v %v", st, err)
		}
	}

	// A group's pool DSN lists each member's pooler: one that does not
	// answer is named, the others are read.
	dead := testenv.FreePort(t)
	n.PoolDSN = strings.Replace(pn.PoolDSN, net.JoinHostPort(pn.Host, strconv.Itoa(pn.PoolPort)),
		net.JoinHostPort(pn.Host, strconv.Itoa(pn.PoolPort))+","+net.JoinHostPort("127.0.0.1", strconv.Itoa(dead)), 1)
	st, err = ReadNode(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(dead))
	if len(st.Poolers) != 1 || st.Errors[deadAddr] == "" {
		t.Fatalf("with a dead member's pooler: poolers %+v errors %v", st.Poolers, st.Errors)
	}
	// None answering is an error naming the node and the addresses.
	n.PoolDSN = "postgres://postgres@" + deadAddr + "/db"
	if _, err := ReadNode(ctx, n); err == nil || !strings.Contains(err.Error(), "pg1") || !strings.Contains(err.Error(), deadAddr) {
		t.Fatalf("no pooler answering: %v", err)
	}
	n.PoolDSN = ""
	if _, err := ReadNode(ctx, n); err == nil || !strings.Contains(err.Error(), "no pooler") {
		t.Fatalf("a node without a pooler: %v", err)
	}
}

// The fleet's worst case: every pool's live supervisors, each running its
// workers and the surge of a swap, each worker keeping perProcess
// connections to the node.
func TestReadDemand(t *testing.T) {
	z, s := zktest.NewMemoryTree(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := topo.MustPaths(z.Root, "c1")
	if err := s.CreateAll(ctx, p.Cluster()); err != nil {
		t.Fatal(err)
	}
	if d, err := ReadDemand(ctx, s, p, 2); err != nil || d.Connections != 0 || len(d.Pools) != 0 {
		t.Fatalf("no pools: %+v %v", d, err)
	}
	surge := 2
	for _, pc := range []struct {
		name             string
		workers, members int
		surge            *int
	}{{"web", 4, 3, &surge}, {"api", 16, 2, nil}} {
		cfg := &topo.PoolConfig{Version: topo.PoolConfigVersion, Command: "/bin/app", Workers: pc.workers, Surge: pc.surge}
		if _, _, err := topo.SetPoolConfig(ctx, s, p, pc.name, cfg, -1); err != nil {
			t.Fatal(err)
		}
		for i := range pc.members {
			r, err := topo.RegisterPoolMember(ctx, s, p, pc.name, topo.PoolMember{Version: 1, Member: pc.name + strconv.Itoa(i), State: "serving"})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Remove(context.Background())
		}
	}
	d, err := ReadDemand(ctx, s, p, 2)
	if err != nil {
		t.Fatal(err)
	}
	// api: 2 × (16 + 16, surge defaults to workers) × 2; web: 3 × (4 + 2) × 2.
	if want := 2*32*2 + 3*6*2; d.Connections != want || len(d.Pools) != 2 || d.PerProcess != 2 {
		t.Fatalf("demand %+v, want %d connections", d, want)
	}
}
