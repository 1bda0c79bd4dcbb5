// Package clustertest holds the cluster fixtures that tests of several
// packages and the benchmarks share: the one cluster on real db nodes
// (Build: record and map in ZooKeeper, DDL, fence installed and synced;
// it returns errors, MustBuild is the tests' form), a benchmark's
// databases on scripts/devenv's servers (Dev), its sessions on a TLS
// environment and its side-by-side runs plain vs TLS (tls.go), a Patroni
// group's mode and health (patroni.go), and for routing tests a
// seed, db nodes that are never dialled, a cluster created in a ZooKeeper
// tree, map files. Test and benchmark support only: no library package
// imports it.
package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Seed is the keystream seed of every test cluster.
const Seed = "5eed0000000000000000000000000001"

// Events is the sharded table of the GC and ownership tests, made by
// EventsDDL on every node.
var Events = topo.TableRecord{Name: "app.events", KeyColumn: "bkey"}

// EventsDDL creates Events.
const EventsDDL = `CREATE SCHEMA IF NOT EXISTS app;
CREATE TABLE app.events (bkey bigint NOT NULL, id bigint NOT NULL, body text, PRIMARY KEY (bkey, id))`

// KV is the sharded table of the move tests and of the moves and schema
// benchmarks, made by KVDDL on every node: a value per user.
var KV = topo.TableRecord{Name: "app.kv", KeyColumn: "bkey"}

// KVDDL creates KV.
const KVDDL = `CREATE SCHEMA IF NOT EXISTS app;
CREATE TABLE IF NOT EXISTS app.kv (bkey bigint NOT NULL, uid text NOT NULL, v bigint NOT NULL, PRIMARY KEY (bkey, uid))`

// KVUpsert writes user $2's value $3 at key $1 into KV.
const KVUpsert = `INSERT INTO app.kv (bkey, uid, v) VALUES ($1, $2, $3) ON CONFLICT (bkey, uid) DO UPDATE SET v = EXCLUDED.v`

// Nodes returns n active db nodes pg1..pgN of weight 1 whose DSNs name
// hosts that do not exist: for tests of routing, not of PostgreSQL.
func Nodes(n int) []bucketmap.Node {
	out := make([]bucketmap.Node, n)
	for i := range out {
		out[i] = bucketmap.Node{ID: bucketmap.NodeID(fmt.Sprintf("pg%d", i+1)), DSN: fmt.Sprintf("postgres://app@db%d:5432/app", i+1), Weight: 1, State: bucketmap.NodeActive}
	}
	return out
}

// Create creates cluster c1 under root with a map of nodes at level, on s,
// and returns an admin store for it.
func Create(t testing.TB, s *zksession.Session, root string, nodes []bucketmap.Node, level int) *bucketmap.Store {
	t.Helper()
	st := bucketmap.NewStore(s, topo.MustPaths(root, "c1"))
	m, err := bucketmap.New(level, nodes, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rec := topo.ClusterRecord{Version: 1, Name: "c1", Seed: Seed, CreatedAt: time.Now().UTC()}
	if err := st.Create(context.Background(), rec, m, bucketmap.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return st
}

// Next is the map's next version, a minute later, with the same owners: for
// a test to edit and publish.
func Next(m *bucketmap.Map) *bucketmap.Map {
	c := m.Clone()
	c.Version++
	c.UpdatedAt = c.UpdatedAt.Add(time.Minute)
	return c
}

// WriteMapFile writes the map file of m (cluster c1) into dir and returns
// its path.
func WriteMapFile(t testing.TB, dir string, m *bucketmap.Map) string {
	t.Helper()
	raw, err := bucketmap.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	data, err := bucketmap.EncodeMapFile("c1", Seed, raw)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, fmt.Sprintf("map-%d.json", m.Version))
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
