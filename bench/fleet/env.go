package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

// env is the throwaway ensemble and db nodes bench/fleet/run started
// (scripts/devenv with its own state directory and ports), driven in this
// process.
type env struct {
	*devenv.Env
	zkAddrs, pgAddrs []string
	admin            []string // the superuser's DSN of each db node's postgres database
	// notesDDL is the notes table, from the file examples/notes embeds
	// (a package main there, so not importable).
	notesDDL string
}

func newEnv() (*env, error) {
	e := &env{Env: devenv.New(devenv.Config{Dir: *envDir, ZKPortBase: *zkPortBase, PGPortBase: *pgPortBase, PGNodes: pgNodes})}
	password, err := clustertest.ReadPassword(e.PasswordFile())
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL password of the throwaway environment (bench/fleet/run starts it): %w", err)
	}
	for i := range devenv.ZKServers {
		e.zkAddrs = append(e.zkAddrs, "127.0.0.1:"+strconv.Itoa(e.ZKPort(i+1)))
	}
	for i := range pgNodes {
		e.pgAddrs = append(e.pgAddrs, "127.0.0.1:"+strconv.Itoa(e.PGPort(i+1)))
		e.admin = append(e.admin, clustertest.AdminDSN(e.pgAddrs[i], password, e.PGSSLParams()))
	}
	ddl, err := os.ReadFile("examples/notes/schema/001-notes.sql") // run from the repository root
	e.notesDDL = string(ddl)
	return e, err
}

const startNodes = 3

// cluster is one fleet's cluster: a ZooKeeper subtree and a database on
// every db node, both fresh, so that every fleet starts from the same
// three-node map.
type cluster struct {
	db    string
	paths topo.Paths
	st    *bucketmap.Store
	ks    *keystream.Keystream
	nodes []bucketmap.Node // all four; the first three start the cluster
}

func (b *bench) newCluster(ctx context.Context, name string) (*cluster, error) {
	c := &cluster{db: fmt.Sprintf("fleet_%s_%d", strings.ReplaceAll(name, "-", "_"), b.started.Unix()), paths: topo.MustPaths(b.root, name)}
	c.nodes = clustertest.DevNodes(b.env.pgAddrs, c.db, b.env.PasswordFile(), b.env.PGSSLParams())
	for i := range c.nodes {
		if err := testenv.Exec(ctx, b.env.admin[i], "CREATE DATABASE "+pgx.Identifier{c.db}.Sanitize()); err != nil {
			return nil, fmt.Errorf("pg%d: %w", i+1, err)
		}
		b.cleanups = append(b.cleanups, func(ctx context.Context) {
			if err := clustertest.DropDatabase(ctx, b.env.admin[i], c.db, say); err != nil {
				say("cleanup: pg%d database %s: %v", i+1, c.db, err)
			}
		})
	}
	// preload runs inside Build, before Build returns the keystream: it
	// needs it first.
	seed := fmt.Sprintf("%x", "fleet-bench-"+name)
	ks, err := keystream.ParseSeed(seed)
	if err == nil {
		c.ks, err = keystream.New(ks)
	}
	if err != nil {
		return nil, err
	}
	cl, err := clustertest.Build(ctx, b.sess, clustertest.Spec{Root: b.root, Name: name, Seed: seed, Level: *level,
		Nodes: c.nodes, Mapped: startNodes, Tables: []topo.TableRecord{{Name: "app.notes", KeyColumn: "bkey"}}, DDL: []string{b.env.notesDDL},
		Prepare: c.preload})
	if err != nil {
		return nil, err
	}
	c.st = cl.Store
	return c, nil
}

// preload COPYs rows-per-bucket notes of users "pre-N" into every bucket
// node i owns, bypassing the fence (as replication does), so that every
// move copies something.
func (c *cluster) preload(ctx context.Context, i int, conn *pgx.Conn, m *bucketmap.Map) error {
	if *rowsPerBucket <= 0 {
		return nil
	}
	counts := make([]int, m.Buckets())
	var rows [][]any
	left := 0
	for bk := range m.Buckets() {
		if m.OwnerIndex(uint32(bk)) == i {
			left += *rowsPerBucket
		} else {
			counts[bk] = *rowsPerBucket // not ours: full already
		}
	}
	for u := 0; left > 0; u++ {
		uid := fmt.Sprintf("pre-%07d", u)
		p := c.ks.Prefix64(uid)
		bk := keystream.BucketOf(p, *level)
		if counts[bk] >= *rowsPerBucket {
			continue
		}
		counts[bk]++
		left--
		rows = append(rows, []any{keystream.Key(p), uid, int64(u), "preloaded " + uid})
	}
	_, err := clustertest.CopyAsReplica(ctx, conn, pgx.Identifier{"app", "notes"}, []string{"bkey", "uid", "id", "body"}, pgx.CopyFromRows(rows))
	if err == nil {
		_, err = conn.Exec(ctx, "ANALYZE app.notes")
	}
	return err
}

// poolConfig is the fleet's one pool: every supervisor binds 127.0.0.1:0,
// a port of its own (all run on this one host), which the load balancer
// finds in /proc.
func (b *bench) poolConfig(mode string, boot time.Duration) *topo.PoolConfig {
	return &topo.PoolConfig{Version: topo.PoolConfigVersion, Command: filepath.Join(b.binDir, "notes"), Workers: *workers,
		Env:             map[string]string{"NOTES_BOOT_DELAY": boot.String()}, // "0s": none
		Listen:          []topo.Listen{{Name: "http", Addr: "tcp://127.0.0.1:0"}},
		GracefulTimeout: topo.Duration(15 * time.Second),
		Readiness:       topo.Readiness{Mode: topo.ReadinessNotify, Timeout: topo.Duration(60*time.Second + boot)},
		MapDelivery:     topo.MapDelivery{Mode: mode}}
}
