package fence

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// The fence sync after a map change: nothing before the cluster has
// sharded tables; then every node brought in step with the new map, a
// node without a fence and an unreachable node reported (the change is
// not undone), a removed node left out. Reconcile repairs drift the same
// way, and Prepare and Check are what `node prepare` and `node check` do.
func TestIntegrationSyncAfterChangeAndReconcile(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	ctx := ctxT(t)
	s := zktest.Session(t, zksession.Config{Connect: z.ConnectString})
	p := topo.MustPaths(z.Root, "c1")
	var nodes []bucketmap.Node
	for i, n := range pg.Nodes[:2] {
		nodes = append(nodes, bucketmap.Node{ID: bucketmap.NodeID(fmt.Sprintf("n%d", i+1)), DSN: n.DSN, Password: "file:" + n.PasswordFile, Weight: 1, State: bucketmap.NodeActive})
	}
	// n3 never answers: nothing listens on port 1.
	nodes = append(nodes, bucketmap.Node{ID: "n3", DSN: "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=1", Weight: 1, State: bucketmap.NodeActive})
	m, err := bucketmap.New(3, nodes, time.Now().UTC())
	if err != nil {
		t.Fatal(err)
	}
	st := bucketmap.NewStore(s, p)
	rec := topo.ClusterRecord{Version: topo.ClusterVersion, Name: "c1", Seed: "abababababababababababababababab", CreatedAt: time.Now().UTC()}
	if err := st.Create(ctx, rec, m, bucketmap.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c1, c2 := pg.Nodes[0].Conn(t), pg.Nodes[1].Conn(t)
	exec(t, c1, eventsDDL)
	exec(t, c2, eventsDDL)

	if res, err := SyncAfterChange(ctx, s, p, m, SyncOptions{}); err != nil || res != nil {
		t.Fatalf("without sharded tables: %+v %v, want nothing done", res, err)
	}
	crec, err := topo.AddTable(ctx, s, p, events)
	if err != nil {
		t.Fatal(err)
	}
	// Only n1 is prepared.
	pr, err := Prepare(ctx, c1, crec, m, "n1")
	if err != nil || len(pr.Actions) == 0 || len(pr.Mismatches) != 0 || !pr.Change.Changed() {
		t.Fatalf("prepare n1: %+v %v", pr, err)
	}
	if pr, err := Prepare(ctx, c1, crec, m, "n1"); err != nil || len(pr.Actions) != 0 {
		t.Fatalf("prepare n1 again: %+v %v, want nothing changed", pr, err)
	}
	if mism, err := Check(ctx, c1, crec, m, "n1"); err != nil || len(mism) != 0 {
		t.Fatalf("check n1: %+v %v", mism, err)
	}
	if mism, err := Check(ctx, c2, crec, m, "n2"); err != nil || len(mism) == 0 {
		t.Fatalf("check of the unprepared n2: %+v %v, want mismatches", mism, err)
	}

	next, err := st.Update(ctx, func(m *bucketmap.Map) error {
		return m.Assign(bucketmap.Bucket{Prefix: 0, Depth: m.Level}, "n2", bucketmap.AssignOptions{NoCopy: true})
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := SyncAfterChange(ctx, s, p, next, SyncOptions{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := map[bucketmap.NodeID]string{}
	for _, r := range res {
		got[r.Node] = r.Status
	}
	if got["n1"] != SyncRepaired || got["n2"] != SyncNotInstalled || got["n3"] != SyncUnreachable || len(res) != 3 {
		t.Fatalf("after assign: %+v", res)
	}
	if f, err := Read(ctx, c1); err != nil || f.MapVersion != next.Version {
		t.Fatalf("n1's fence after the sync: %+v %v, want map version %d", f, err, next.Version)
	}

	// n3 goes: once removed, it is left out.
	gone, err := st.Update(ctx, func(m *bucketmap.Map) error {
		if _, err := m.MarkDown("n3"); err != nil {
			return err
		}
		return m.RemoveNode("n3")
	})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := SyncAfterChange(ctx, s, p, gone, SyncOptions{}); err != nil || len(res) != 2 {
		t.Fatalf("after removing n3: %+v %v, want n1 and n2 only", res, err)
	}

	// Drift: n1's fence put back a version; Reconcile repairs it.
	exec(t, c1, `DELETE FROM shardvisor.ownership`)
	if _, _, err := Reconcile(ctx, st, []bucketmap.NodeID{"nope"}, nil); !errors.Is(err, bucketmap.ErrUnknownNode) {
		t.Fatalf("reconcile of an unknown node: %v", err)
	}
	cur, rr, err := Reconcile(ctx, st, []bucketmap.NodeID{"n1"}, nil)
	if err != nil || len(rr) != 1 || rr[0].Status != SyncRepaired || len(rr[0].Added) == 0 || rr[0].Bad() || cur.Version != gone.Version {
		t.Fatalf("reconcile n1: %+v %v", rr, err)
	}
	// All nodes of the registry, the removed n3 too (it may still have a
	// fence that claims something).
	if _, rr, err := Reconcile(ctx, st, nil, nil); err != nil || len(rr) != 3 || rr[0].Status != SyncInStep || rr[1].Status != SyncNotInstalled || !rr[2].Bad() {
		t.Fatalf("reconcile all: %+v %v", rr, err)
	}

	// An unreadable cluster record: nothing is touched.
	if _, err := SyncAfterChange(ctx, s, topo.MustPaths(z.Root, "none"), next, SyncOptions{}); !errors.Is(err, topo.ErrNoCluster) {
		t.Fatalf("missing cluster: %v", err)
	}
}
