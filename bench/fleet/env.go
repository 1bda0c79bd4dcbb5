package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

// env is the throwaway ensemble and db nodes bench/fleet/run started
// (scripts/devenv with its own state directory and ports).
type env struct {
	dir      string
	dev      *devenv.Env // that environment, driven in this process
	zkAddrs  []string
	pgAddrs  []string
	pwFile   string
	password string
	// notesDDL is the notes table, from the file examples/notes embeds
	// (a package main there, so not importable).
	notesDDL string
}

func newEnv(root string) (*env, error) {
	e := &env{dir: *envDir, pwFile: benchkit.PasswordFile(*envDir),
		dev: devenv.New(devenv.Config{Dir: *envDir, ZKPortBase: *zkPortBase, PGPortBase: *pgPortBase, PGNodes: pgNodes})}
	for i := range 3 {
		e.zkAddrs = append(e.zkAddrs, "127.0.0.1:"+strconv.Itoa(*zkPortBase+i))
	}
	for i := range pgNodes {
		e.pgAddrs = append(e.pgAddrs, "127.0.0.1:"+strconv.Itoa(*pgPortBase+i))
	}
	pw, err := benchkit.ReadPassword(e.pwFile)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL password of the throwaway environment (bench/fleet/run starts it): %w", err)
	}
	e.password = pw
	ddl, err := os.ReadFile(filepath.Join(root, "examples", "notes", "schema", "001-notes.sql"))
	if err != nil {
		return nil, err
	}
	e.notesDDL = string(ddl)
	return e, nil
}

func (e *env) zkConnect() string { return strings.Join(e.zkAddrs, ",") }

func (e *env) adminDSN(i int) string {
	return benchkit.AdminDSN(e.pgAddrs[i], e.password)
}

// dropDB drops database db of node i, with the subscriptions a move cut
// short left in it (they block DROP DATABASE) and its slots.
func (e *env) dropDB(ctx context.Context, i int, db string) error {
	u, _ := url.Parse(e.adminDSN(i))
	u.Path = "/" + db
	if conn, err := pgx.Connect(ctx, u.String()); err == nil {
		rows, _ := conn.Query(ctx, `SELECT subname FROM pg_subscription WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())`)
		subs, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, s := range subs {
			id := pgx.Identifier{s}.Sanitize()
			for _, q := range []string{"ALTER SUBSCRIPTION " + id + " DISABLE", "ALTER SUBSCRIPTION " + id + " SET (slot_name = NONE)", "DROP SUBSCRIPTION " + id} {
				if _, err := conn.Exec(ctx, q); err != nil {
					say("cleanup: pg%d %s: %v", i+1, q, err)
				}
			}
		}
		conn.Close(context.Background())
	}
	return testenv.DropDatabase(ctx, e.adminDSN(i), db)
}

var notesTable = topo.TableRecord{Name: "app.notes", KeyColumn: "bkey"}

const startNodes = 3

// cluster is one fleet's cluster: a ZooKeeper subtree and a database on
// every db node, both fresh, so that every fleet starts from the same
// three-node map.
type cluster struct {
	name  string
	db    string
	paths topo.Paths
	st    *bucketmap.Store
	ks    *keystream.Keystream
	nodes []bucketmap.Node // all four; the first three start the cluster
}

func (b *bench) newCluster(ctx context.Context, name string) (*cluster, error) {
	c := &cluster{name: name, db: fmt.Sprintf("fleet_%s_%d", strings.ReplaceAll(name, "-", "_"), b.started.Unix())}
	var err error
	if c.paths, err = topo.NewPaths(b.root, name); err != nil {
		return nil, err
	}
	c.st = bucketmap.NewStore(b.sess, c.paths)
	for i, addr := range b.env.pgAddrs {
		dsn := (&url.URL{Scheme: "postgres", User: url.User("postgres"), Host: addr, Path: "/" + c.db, RawQuery: "sslmode=disable"}).String()
		c.nodes = append(c.nodes, bucketmap.Node{ID: bucketmap.NodeID(fmt.Sprintf("pg%d", i+1)), DSN: dsn, Password: "file:" + b.env.pwFile, Weight: 1, State: bucketmap.NodeActive})
		if err := testenv.Exec(ctx, b.env.adminDSN(i), "CREATE DATABASE "+pgx.Identifier{c.db}.Sanitize()); err != nil {
			return nil, fmt.Errorf("pg%d: %w", i+1, err)
		}
		b.cleanups = append(b.cleanups, func(ctx context.Context) {
			if err := b.env.dropDB(ctx, i, c.db); err != nil {
				say("cleanup: pg%d database %s: %v", i+1, c.db, err)
			}
		})
	}
	m, err := bucketmap.New(*level, c.nodes[:startNodes], time.Now())
	if err != nil {
		return nil, err
	}
	seedHex := fmt.Sprintf("%x", "fleet-bench-"+name)
	rec := topo.ClusterRecord{Version: topo.ClusterVersion, Name: name, Seed: seedHex, CreatedAt: time.Now().UTC(), Tables: []topo.TableRecord{notesTable}}
	if err := c.st.Create(ctx, rec, m, bucketmap.CreateOptions{}); err != nil {
		return nil, err
	}
	seed, err := keystream.ParseSeed(seedHex)
	if err != nil {
		return nil, err
	}
	if c.ks, err = keystream.New(seed); err != nil {
		return nil, err
	}
	for i, n := range c.nodes {
		conn, err := dbnode.Connect(ctx, n)
		if err != nil {
			return nil, err
		}
		_, err = conn.Exec(ctx, b.env.notesDDL)
		if err == nil {
			_, err = fence.Install(ctx, conn, name, n.ID, rec.Tables)
		}
		if err == nil && i < startNodes {
			_, err = fence.Sync(ctx, conn, m, n.ID)
		}
		if err == nil && i < startNodes {
			err = c.preload(ctx, conn, m, i)
		}
		conn.Close(context.Background())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.ID, err)
		}
	}
	return c, nil
}

// preload COPYs rows-per-bucket notes of users "pre-N" into every bucket
// node i owns, bypassing the fence (as replication does), so that every
// move copies something.
func (c *cluster) preload(ctx context.Context, conn *pgx.Conn, m *bucketmap.Map, i int) error {
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
	if _, err := conn.Exec(ctx, "SET session_replication_role = replica"); err != nil {
		return err
	}
	_, err := conn.CopyFrom(ctx, pgx.Identifier{"app", "notes"}, []string{"bkey", "uid", "id", "body"}, pgx.CopyFromRows(rows))
	if err == nil {
		_, err = conn.Exec(ctx, "RESET session_replication_role; ANALYZE app.notes")
	}
	return err
}

// addFourth puts the fourth node in the map and syncs its fence: the
// rebalancer then moves a quarter of the buckets to it.
func (c *cluster) addFourth(ctx context.Context) (*bucketmap.Map, error) {
	n := c.nodes[startNodes]
	m, err := c.st.Update(ctx, func(m *bucketmap.Map) error { return m.AddNode(n) })
	if err != nil {
		return nil, fmt.Errorf("adding %s: %w", n.ID, err)
	}
	conn, err := dbnode.Connect(ctx, n)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	if _, err := fence.Sync(ctx, conn, m, n.ID); err != nil {
		return nil, fmt.Errorf("%s: fence sync: %w", n.ID, err)
	}
	return m, nil
}

// poolConfig is the fleet's one pool: every supervisor binds 127.0.0.1:0,
// a port of its own (all run on this one host), which the load balancer
// finds in /proc.
func (b *bench) poolConfig(mode string, boot time.Duration) *topo.PoolConfig {
	envs := map[string]string{}
	if boot > 0 {
		envs["NOTES_BOOT_DELAY"] = boot.String()
	}
	cfg := &topo.PoolConfig{Version: topo.PoolConfigVersion, Command: filepath.Join(b.binDir, "notes"), Env: envs, Workers: *workers,
		Listen:          []topo.Listen{{Name: "http", Addr: "tcp://127.0.0.1:0"}},
		GracefulTimeout: topo.Duration(15 * time.Second),
		Readiness:       topo.Readiness{Mode: topo.ReadinessNotify, Timeout: topo.Duration(60*time.Second + boot)},
		MapDelivery:     topo.MapDelivery{Mode: mode}}
	return cfg
}

func hostPort(addr string) (string, int) {
	h, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return h, n
}
