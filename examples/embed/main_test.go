package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/worker"
	"github.com/shardvisor/shardvisor/workerproto"
	"github.com/shardvisor/shardvisor/zksession"
)

// The servers are those of scripts/devenv (see its header) unless given by
// SHARDVISOR_TEST_ZK / SHARDVISOR_TEST_PG, as for the repository's own
// integration tests. Like those, this test fails (never skips) when they
// are missing; only -short skips it.

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func zkConnect() string {
	if s := os.Getenv("SHARDVISOR_TEST_ZK"); s != "" {
		return s
	}
	base := envInt("SHARDVISOR_ZK_PORT_BASE", 21811)
	var hosts []string
	for i := range 3 {
		hosts = append(hosts, net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i)))
	}
	return strings.Join(hosts, ",")
}

// pgAdminDSNs returns two admin DSNs (with password).
func pgAdminDSNs(t *testing.T) []string {
	if s := os.Getenv("SHARDVISOR_TEST_PG"); s != "" {
		dsns := strings.Split(s, ",")
		if len(dsns) < 2 {
			fail(t, "SHARDVISOR_TEST_PG gives %d PostgreSQL nodes; the test wants 2", len(dsns))
		}
		return dsns[:2]
	}
	dir := os.Getenv("SHARDVISOR_DEVENV_DIR")
	if dir == "" {
		dir = "/tmp/shardvisor-devenv"
	}
	pw, err := os.ReadFile(filepath.Join(dir, "pg", "password"))
	if err != nil {
		fail(t, "PostgreSQL password: %v", err)
	}
	base := envInt("SHARDVISOR_PG_PORT_BASE", 25432)
	var out []string
	for i := range 2 {
		u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", strings.TrimSpace(string(pw))),
			Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i)), Path: "/postgres", RawQuery: "sslmode=disable"}
		out = append(out, u.String())
	}
	return out
}

func fail(t *testing.T, format string, args ...any) {
	t.Helper()
	hint := "start them with `scripts/devenv --plain up` in the repository (the tests dial plain), or run `go test -short` to skip"
	if os.Getenv("CI") == "true" {
		hint = "CI=true: integration servers are required"
	}
	t.Fatalf(format+" (%s)", append(args, hint)...)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// newDatabase creates a fresh database with the notes table on one node and
// returns the node's entry for the bucket map: a DSN without password and a
// reference to where the password is (here an environment variable).
func newDatabase(t *testing.T, ctx context.Context, id, adminDSN, db string) bucketmap.Node {
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		fail(t, "PostgreSQL %s: %v", id, err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, adminDSN); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
			c.Close(ctx)
		}
	})
	u, _ := url.Parse(adminDSN)
	pw, _ := u.User.Password()
	env := "EMBED_TEST_PASSWORD_" + strings.ToUpper(id)
	t.Setenv(env, pw)
	u.User = url.User(u.User.Username())
	u.Path = "/" + db
	conn, err := pgx.Connect(ctx, withDatabase(adminDSN, db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, Schema); err != nil {
		t.Fatal(err)
	}
	return bucketmap.Node{ID: bucketmap.NodeID(id), DSN: u.String(), Password: "env:" + env, Weight: 1, State: bucketmap.NodeActive}
}

// withDatabase is dsn with another database.
func withDatabase(dsn, db string) string {
	u, _ := url.Parse(dsn)
	u.Path = "/" + db
	return u.String()
}

// count counts uid's rows on one node, bypassing the router.
func count(t *testing.T, ctx context.Context, dsn, uid string) int {
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM notes WHERE uid = $1`, uid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestEmbeddedRouter(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := zaptest.NewLogger(t)

	// A cluster of two db nodes in a ZooKeeper root of its own, created
	// through the public API (as `shardctl init` does).
	s, err := zksession.Open(zksession.Config{Connect: zkConnect(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close) // after the cleanup of root below
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	err = s.WaitConnected(wctx)
	wcancel()
	if err != nil {
		fail(t, "ZooKeeper at %s: %v", zkConnect(), err)
	}
	suffix := randomHex(6)
	root := "/shardvisor-embed-test-" + suffix
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.DeleteAll(ctx, root); err != nil {
			t.Errorf("cleanup %s: %v", root, err)
		}
	})
	var nodes []bucketmap.Node
	adminDSNs := pgAdminDSNs(t)
	for i, dsn := range adminDSNs {
		nodes = append(nodes, newDatabase(t, ctx, fmt.Sprintf("pg%d", i+1), dsn, "embed_"+suffix))
	}
	m, err := bucketmap.New(4, nodes, time.Now().UTC())
	if err != nil {
		t.Fatal(err)
	}
	seed := keystream.Seed(make([]byte, 32))
	if _, err := rand.Read(seed); err != nil {
		t.Fatal(err)
	}
	p, err := topo.NewPaths(root, "embed")
	if err != nil {
		t.Fatal(err)
	}
	rec := topo.ClusterRecord{Version: topo.ClusterVersion, Name: "embed", Seed: seed.String(), CreatedAt: time.Now().UTC()}
	if err := bucketmap.NewStore(s, p).Create(ctx, rec, m, bucketmap.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The app's own code: Dial the cluster.
	t.Setenv("SHARDVISOR_ZK", zkConnect())
	t.Setenv("SHARDVISOR_ZK_ROOT", root)
	t.Setenv("SHARDVISOR_CLUSTER", "embed")
	t.Setenv("SHARDVISOR_ZK_AUTH_FILE", "")
	r, err := openRouter(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	// Its answers agree with the keystream and the map we wrote.
	ks, err := keystream.New(seed)
	if err != nil {
		t.Fatal(err)
	}
	owners := map[bucketmap.NodeID]int{}
	for i := range 64 {
		uid := fmt.Sprintf("user-%d", i)
		rt, err := r.Route(uid)
		if err != nil {
			t.Fatal(err)
		}
		b := m.BucketOf(ks, uid)
		if rt.Bucket != b.Prefix || rt.Level != b.Depth || rt.Node != m.OwnerOf(b) || rt.MapVersion != m.Version || rt.Stale || rt.Suspended {
			t.Fatalf("route %s: %+v; want bucket %s on %s at map version %d", uid, rt, b, m.OwnerOf(b), m.Version)
		}
		owners[rt.Node]++
	}
	if len(owners) != 2 {
		t.Fatalf("64 users all on %v; want both nodes used", owners)
	}

	// A write through the router lands on the owner only, and reads back.
	dsnOf := map[bucketmap.NodeID]string{}
	for i, n := range nodes {
		dsnOf[n.ID] = withDatabase(adminDSNs[i], "embed_"+suffix)
	}
	for i := range 4 {
		uid := fmt.Sprintf("user-%d", i)
		if err := saveNote(ctx, r, uid, "hello "+uid); err != nil {
			t.Fatal(err)
		}
		got, err := readNotes(ctx, r, uid)
		if err != nil || !slices.Equal(got, []string{"hello " + uid}) {
			t.Fatalf("notes of %s: %q, %v", uid, got, err)
		}
		rt, _ := r.Route(uid)
		for _, n := range nodes {
			want := 0
			if n.ID == rt.Node {
				want = 1
			}
			if c := count(t, ctx, dsnOf[n.ID], uid); c != want {
				t.Errorf("%s has %d rows of %s (owner %s); want %d", n.ID, c, uid, rt.Node, want)
			}
		}
	}

	// As a worker: the same answers from the map file the supervisor would
	// hand over, with no ZooKeeper.
	doc, _, err := r.MapFile()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "map.json")
	if err := os.WriteFile(file, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SHARDVISOR_ZK", "")
	t.Setenv(workerproto.EnvMapFile, file)
	fr, err := openRouter(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.Close()
	for i := range 16 {
		uid := fmt.Sprintf("user-%d", i)
		a, _ := r.Route(uid)
		b, err := fr.Route(uid)
		if err != nil || a != b {
			t.Fatalf("map file route of %s: %+v, %v; live: %+v", uid, b, err, a)
		}
	}
	if got, err := readNotes(ctx, fr, "user-0"); err != nil || len(got) != 1 {
		t.Fatalf("notes through the map-file router: %q, %v", got, err)
	}
	// Run by hand, the worker listens on the fallback address.
	ln, err := worker.Listener("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}
