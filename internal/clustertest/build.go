package clustertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Spec is a cluster on real db nodes, as Build creates it.
type Spec struct {
	// Root and Name place the cluster in ZooKeeper (topo.NewPaths).
	Root, Name string
	// Seed is the keystream seed in hex (default: Seed).
	Seed  string
	Level int
	// Nodes are every db node prepared (DDL run, fence installed); the
	// map holds the first Mapped of them (0: all), so that a test or a
	// benchmark can add the others later.
	Nodes  []bucketmap.Node
	Mapped int
	// Tables are the cluster record's sharded tables, created on every
	// node by DDL (each run in turn) and fenced.
	Tables []topo.TableRecord
	DDL    []string
	// NoFence leaves the fence out: a cluster of a test or benchmark that
	// writes to its nodes directly.
	NoFence bool
	// Now stamps the map and the record (default: the time of Build).
	Now time.Time
	// Prepare, when set, runs on every mapped node after its fence is
	// synced, on the same connection (to load rows, say).
	Prepare func(ctx context.Context, i int, c *pgx.Conn, m *bucketmap.Map) error
	// Parallel prepares the nodes at once rather than in turn.
	Parallel bool
}

// Cluster is what Build made.
type Cluster struct {
	Store     *bucketmap.Store
	Map       *bucketmap.Map // the first version
	Record    topo.ClusterRecord
	Keystream *keystream.Keystream
}

// Build creates the cluster sp describes: its record and map in
// ZooKeeper on s, and on every node the DDL, the fence installed and, on
// the mapped nodes, synced to the map. It returns errors rather than
// failing a test, so that the benchmarks call it too; MustBuild is the
// tests' form.
func Build(ctx context.Context, s *zksession.Session, sp Spec) (*Cluster, error) {
	if sp.Seed == "" {
		sp.Seed = Seed
	}
	if sp.Now.IsZero() {
		sp.Now = time.Now()
	}
	mapped := sp.Nodes
	if sp.Mapped > 0 {
		mapped = sp.Nodes[:sp.Mapped]
	}
	p, err := topo.NewPaths(sp.Root, sp.Name)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Store: bucketmap.NewStore(s, p)}
	if c.Map, err = bucketmap.New(sp.Level, mapped, sp.Now); err != nil {
		return nil, err
	}
	c.Record = topo.ClusterRecord{Version: topo.ClusterVersion, Name: sp.Name, Seed: sp.Seed, CreatedAt: sp.Now.UTC(), Tables: sp.Tables}
	if err := c.Store.Create(ctx, c.Record, c.Map, bucketmap.CreateOptions{}); err != nil {
		return nil, err
	}
	seed, err := keystream.ParseSeed(sp.Seed)
	if err != nil {
		return nil, err
	}
	if c.Keystream, err = keystream.New(seed); err != nil {
		return nil, err
	}
	prepare := func(i int, n bucketmap.Node, conn *pgx.Conn) error {
		for _, q := range sp.DDL {
			if _, err := conn.Exec(ctx, q); err != nil {
				return err
			}
		}
		if !sp.NoFence {
			if _, err := fence.Install(ctx, conn, sp.Name, n.ID, sp.Tables); err != nil {
				return err
			}
		}
		if i >= len(mapped) {
			return nil
		}
		if !sp.NoFence {
			if _, err := fence.Sync(ctx, conn, c.Map, n.ID); err != nil {
				return err
			}
		}
		if sp.Prepare != nil {
			return sp.Prepare(ctx, i, conn, c.Map)
		}
		return nil
	}
	if sp.Parallel {
		err = EachNode(ctx, sp.Nodes, prepare)
	} else {
		for i := range sp.Nodes {
			if err = EachNode(ctx, sp.Nodes[i:i+1], func(_ int, n bucketmap.Node, conn *pgx.Conn) error { return prepare(i, n, conn) }); err != nil {
				break
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// MustBuild is Build for a test: it fails t on an error.
func MustBuild(t testing.TB, s *zksession.Session, sp Spec) *Cluster {
	t.Helper()
	c, err := Build(context.Background(), s, sp)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// EachNode runs fn on every node at once, each with its own connection
// (dbnode.Connect), and joins their errors, each named by its node.
func EachNode(ctx context.Context, nodes []bucketmap.Node, fn func(i int, n bucketmap.Node, c *pgx.Conn) error) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dbnode.Connect(ctx, n)
			if err == nil {
				err = fn(i, n, c)
				c.Close(context.Background())
			}
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", n.ID, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// AddNode adds node n, prepared by Build but not mapped, to st's map and
// syncs its fence: the rebalancer then moves buckets to it.
func AddNode(ctx context.Context, st *bucketmap.Store, n bucketmap.Node) (*bucketmap.Map, error) {
	m, err := st.Update(ctx, func(m *bucketmap.Map) error { return m.AddNode(n) })
	if err == nil {
		err = EachNode(ctx, []bucketmap.Node{n}, func(_ int, _ bucketmap.Node, c *pgx.Conn) error {
			_, err := fence.Sync(ctx, c, m, n.ID)
			return err
		})
	}
	if err != nil {
		return nil, fmt.Errorf("adding %s: %w", n.ID, err)
	}
	return m, nil
}

// Node is db node id on a server at dsn whose password is in pwFile.
func Node(id, dsn, pwFile string) bucketmap.Node {
	return bucketmap.Node{ID: bucketmap.NodeID(id), DSN: dsn, Password: "file:" + pwFile, Weight: 1, State: bucketmap.NodeActive}
}

// NodesOf registers the servers of pg as db nodes prefix1, prefix2, ...
// in their order; a Patroni group among them is registered as one.
func NodesOf(pg *testenv.PG, prefix string) []bucketmap.Node {
	var out []bucketmap.Node
	for i, n := range pg.Nodes {
		node := Node(fmt.Sprintf("%s%d", prefix, i+1), n.DSN, n.PasswordFile)
		if n.PatroniScope != "" {
			node.Patroni = bucketmap.Patroni{Namespace: n.PatroniNamespace, Scope: n.PatroniScope}
		}
		out = append(out, node)
	}
	return out
}

// CopyAsReplica COPYs rows into table on c as replication does (the
// session's replication role is replica, so the fence lets them in): to
// load a benchmark's rows straight into their owners.
func CopyAsReplica(ctx context.Context, c *pgx.Conn, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if _, err := c.Exec(ctx, "SET session_replication_role = replica"); err != nil {
		return 0, err
	}
	n, err := c.CopyFrom(ctx, table, cols, src)
	if err == nil {
		_, err = c.Exec(ctx, "RESET session_replication_role")
	}
	return n, err
}
