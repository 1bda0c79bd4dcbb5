package ownership_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/ownership"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

var events = clustertest.Events

const eventsDDL = clustertest.EventsDDL

// keyIn is a key inside bucket b at level.
func keyIn(level int, b uint32) int64 {
	lo, hi, _ := keystream.Range(level, b)
	return lo + (hi-lo)/2
}

var nextID int

// write inserts a row with key k on c: nil, or the fence's refusal.
func write(c *pgx.Conn, k int64) error {
	nextID++
	_, err := c.Exec(context.Background(), `INSERT INTO app.events VALUES ($1, $2, 'x')`, k, nextID)
	return err
}

func mustWrite(t *testing.T, c *pgx.Conn, node string, k int64) {
	t.Helper()
	if err := write(c, k); err != nil {
		t.Fatalf("write of key %d to %s, which owns it: %v", k, node, err)
	}
}

func mustRefuse(t *testing.T, c *pgx.Conn, node string, k int64) {
	t.Helper()
	if err := write(c, k); !fence.IsRejected(err) {
		t.Fatalf("write of key %d to %s, which no longer owns it: %v, want the fence's refusal (SQLSTATE %s)", k, node, err, fence.SQLState)
	}
}

func statuses(res *ownership.Result) map[bucketmap.NodeID]string {
	out := map[bucketmap.NodeID]string{}
	for _, s := range res.Fences {
		out[s.Node] = s.Status
	}
	return out
}

// A Go program that changes ownership through package ownership gets the
// fences brought along: after each call a write to a bucket the node no
// longer owns is refused there, and accepted on its new owner. A node that
// cannot be reached (n3: nothing listens) or has no fence yet is reported
// as drift, with the command that repairs it, and the map change stands.
// The same change through bucketmap.Store.Update leaves the fence behind.
func TestIntegrationChangesBringFencesAlong(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := zktest.Session(t, zksession.Config{Connect: z.ConnectString})
	p := topo.MustPaths(z.Root, "c1")
	st := bucketmap.NewStore(s, p)
	var nodes []bucketmap.Node
	for i, n := range pg.Nodes[:2] {
		nodes = append(nodes, bucketmap.Node{ID: bucketmap.NodeID(fmt.Sprintf("n%d", i+1)), DSN: n.DSN, Password: "file:" + n.PasswordFile, Weight: 1, State: bucketmap.NodeActive})
	}
	nodes = append(nodes, bucketmap.Node{ID: "n3", DSN: "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=1", Weight: 1, State: bucketmap.NodeActive})
	const level = 3
	m, err := bucketmap.New(level, nodes, time.Now().UTC())
	if err != nil {
		t.Fatal(err)
	}
	own := ownership.New(st, ownership.Options{Timeout: 5 * time.Second})
	rec := topo.ClusterRecord{Version: topo.ClusterVersion, Name: "c1", Seed: "abababababababababababababababab", CreatedAt: time.Now().UTC()}
	res, err := own.Create(ctx, rec, m, bucketmap.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Fences != nil || res.FenceErr != nil || len(res.Warnings()) != 0 || res.Map.Version != m.Version {
		t.Fatalf("create without sharded tables: %+v, want no fence touched and no drift", res)
	}
	conns := map[bucketmap.NodeID]*pgx.Conn{"n1": pg.Nodes[0].Conn(t), "n2": pg.Nodes[1].Conn(t)}
	crec, err := topo.AddTable(ctx, s, p, events)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		if _, err := c.Exec(ctx, eventsDDL); err != nil {
			t.Fatal(err)
		}
	}
	// Only n1 has a fence so far.
	if _, err := fence.Prepare(ctx, conns["n1"], crec, m, "n1"); err != nil {
		t.Fatal(err)
	}

	// A bucket of n1's goes to n2: n1 refuses its writes at once; n2 has
	// no fence (drift: prepare it), n3 is unreachable (drift: reconcile).
	b := -1
	for i := range m.Buckets() {
		if m.Owner(uint32(i)) == "n1" {
			b = i
			break
		}
	}
	if b < 0 {
		t.Fatal("n1 owns no bucket")
	}
	k := keyIn(level, uint32(b))
	mustWrite(t, conns["n1"], "n1", k)
	from, res, err := own.Assign(ctx, bucketmap.Bucket{Prefix: uint32(b), Depth: level}, "n2", bucketmap.AssignOptions{NoCopy: true})
	if err != nil {
		t.Fatal(err)
	}
	if from != "n1" || res.Map.Owner(uint32(b)) != "n2" {
		t.Fatalf("assign: from %s, owner now %s", from, res.Map.Owner(uint32(b)))
	}
	got := statuses(res)
	if got["n1"] != fence.SyncRepaired || got["n2"] != fence.SyncNotInstalled || got["n3"] != fence.SyncUnreachable {
		t.Fatalf("fences after assign: %v", got)
	}
	mustRefuse(t, conns["n1"], "n1", k)
	warn := strings.Join(res.Warnings(), "\n")
	for _, want := range []string{
		"fence drift: node n2 has no fence installed, so writes to it are not fenced; run `shardctl node prepare n2`",
		fmt.Sprintf("fence drift: node n3 was not brought to map version %d (unreachable: ", res.Map.Version),
		"its fence keeps its previous ownership until `shardctl node reconcile` succeeds",
	} {
		if !strings.Contains(warn, want) {
			t.Errorf("warnings %q lack %q", warn, want)
		}
	}
	if d := res.Drift(); len(d) != 2 {
		t.Errorf("drift %+v, want n2 and n3", d)
	}
	// The unreachable node did not undo the change.
	if cur, _, err := st.Load(ctx); err != nil || cur.Version != res.Map.Version || cur.Owner(uint32(b)) != "n2" {
		t.Fatalf("map after assign with an unreachable node: %v, %v", cur, err)
	}

	// n2 prepared; the bucket comes back: n2 refuses, n1 accepts.
	if _, err := fence.Prepare(ctx, conns["n2"], crec, res.Map, "n2"); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, conns["n2"], "n2", k)
	if _, res, err = own.Assign(ctx, bucketmap.Bucket{Prefix: uint32(b), Depth: level}, "n1", bucketmap.AssignOptions{NoCopy: true}); err != nil {
		t.Fatal(err)
	}
	mustRefuse(t, conns["n2"], "n2", k)
	mustWrite(t, conns["n1"], "n1", k)

	// Node down: n1's buckets go to n2 and n3 without copying; n1's fence
	// refuses them. n3 is still drift, not an error.
	_, res, err = own.NodeDown(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if got := statuses(res); got["n1"] != fence.SyncRepaired || got["n3"] != fence.SyncUnreachable {
		t.Fatalf("fences after node down: %v", got)
	}
	mustRefuse(t, conns["n1"], "n1", k)
	if owner := res.Map.Owner(uint32(b)); owner == "n2" {
		mustWrite(t, conns["n2"], "n2", k)
	}
	// Up again, and a bucket back to n1: its fence follows.
	if res, err = own.NodeUp(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, res, err = own.Assign(ctx, bucketmap.Bucket{Prefix: uint32(b), Depth: level}, "n1", bucketmap.AssignOptions{NoCopy: true, Force: true}); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, conns["n1"], "n1", k)

	// A split changes no owner: the fence follows it to the new level and
	// the bucket's key stays writable on its owner, refused elsewhere.
	if res, err = own.Split(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if res.Map.Level != level+1 || statuses(res)["n1"] == fence.SyncUnreachable {
		t.Fatalf("split: level %d, fences %v", res.Map.Level, statuses(res))
	}
	mustWrite(t, conns["n1"], "n1", k)
	mustRefuse(t, conns["n2"], "n2", k)

	// Drain: a registry change; the fences are brought to its version.
	if res, err = own.Drain(ctx, "n2"); err != nil {
		t.Fatal(err)
	}
	if got := statuses(res); got["n1"] == fence.SyncUnreachable || got["n2"] == fence.SyncUnreachable {
		t.Fatalf("fences after drain: %v", got)
	}

	// The same kind of change made behind ownership's back, through the
	// map store alone: n1's fence stays behind and accepts the write...
	b2 := uint32(2 * b) // the bucket k falls in at the new level
	if next, err := st.Update(ctx, func(m *bucketmap.Map) error {
		return m.Assign(bucketmap.Bucket{Prefix: b2, Depth: m.Level}, "n3", bucketmap.AssignOptions{NoCopy: true, Force: true})
	}); err != nil {
		t.Fatal(err)
	} else if lo, hi, _ := keystream.Range(level+1, b2); next.Owner(b2) != "n3" || k < lo || k > hi {
		t.Fatalf("bucket %d at level %d: owner %s", b2, level+1, next.Owner(b2))
	}
	mustWrite(t, conns["n1"], "n1", k)
	// ...until the reconciler (ownership.Reconcile) brings it in step.
	if _, _, err := ownership.Reconcile(ctx, st, []bucketmap.NodeID{"n1"}, nil); err != nil {
		t.Fatal(err)
	}
	mustRefuse(t, conns["n1"], "n1", k)
}

// A map change that is refused changes nothing and touches no fence.
func TestIntegrationRefusedChangeIsAnError(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := zktest.Session(t, zksession.Config{Connect: z.ConnectString})
	st := bucketmap.NewStore(s, topo.MustPaths(z.Root, "c1"))
	m, err := bucketmap.New(2, []bucketmap.Node{{ID: "n1", DSN: "postgres://x@127.0.0.1:1/x", Weight: 1, State: bucketmap.NodeActive}}, time.Now().UTC())
	if err != nil {
		t.Fatal(err)
	}
	own := ownership.New(st, ownership.Options{})
	rec := topo.ClusterRecord{Version: topo.ClusterVersion, Name: "c1", Seed: "abababababababababababababababab", CreatedAt: time.Now().UTC()}
	if _, err := own.Create(ctx, rec, m, bucketmap.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, res, err := own.Assign(ctx, bucketmap.Bucket{Prefix: uint32(0), Depth: bucketmap.AtLevel}, "nope", bucketmap.AssignOptions{NoCopy: true}); err == nil || res != nil {
		t.Fatalf("assign to an unknown node: %+v, %v; want an error", res, err)
	}
	if _, err := own.NodeUp(ctx, "nope"); err == nil {
		t.Fatal("node up of an unknown node: no error")
	}
	if cur, _, err := st.Load(ctx); err != nil || cur.Version != m.Version {
		t.Fatalf("map after refused changes: version %d (%v), want %d", cur.Version, err, m.Version)
	}
}
