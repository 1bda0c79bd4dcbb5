package backup_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/backup"
	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// notes is a sharded table with more than a key and a value: the restore
// compares whole rows.
var notes = topo.TableRecord{Name: "app.notes", KeyColumn: "bkey"}

const notesDDL = `CREATE SCHEMA IF NOT EXISTS app;
CREATE TABLE IF NOT EXISTS app.notes (bkey bigint NOT NULL, uid text NOT NULL, id int NOT NULL, body text NOT NULL, tag text,
	PRIMARY KEY (bkey, uid, id))`

// cluster is a test cluster on the dev environment's servers, which
// archive into the environment's pgBackRest repository.
type cluster struct {
	t     testing.TB
	st    *bucketmap.Store
	nodes []bucketmap.Node
	pg    backup.PGBackRest
	conns map[bucketmap.NodeID]*pgx.Conn
}

// scratchDir is a directory for scratch servers that the user pgBackRest
// runs as can reach (t.TempDir is private to this process's user).
func scratchDir(t testing.TB) string {
	d, err := os.MkdirTemp("", "shardvisor-scratch-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func newCluster(t testing.TB, level int) *cluster {
	t.Helper()
	pg := testenv.StartPGNodes(t, 2)
	z := testenv.StartZK(t)
	s := zktest.Session(t, zksession.Config{Connect: z.ConnectString, SessionTimeout: 4 * time.Second})
	nodes := clustertest.NodesOf(pg, "pg")
	c := clustertest.MustBuild(t, s, clustertest.Spec{Root: z.Root, Name: "bk", Level: level, Nodes: nodes, Tables: []topo.TableRecord{notes}, DDL: []string{notesDDL}})
	cmd, cfg := testenv.PGBackRest(t)
	cl := &cluster{t: t, st: c.Store, nodes: nodes, pg: backup.PGBackRest{Command: cmd, Config: cfg}, conns: map[bucketmap.NodeID]*pgx.Conn{}}
	ctx := context.Background()
	if _, err := topo.UpdateBackupConfig(ctx, s, c.Store.Paths(), func(b *topo.BackupConfig) error {
		for i, n := range nodes {
			b.Stanzas[string(n.ID)] = testenv.Stanza(pg.Nodes[i])
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		conn, err := dbnode.Connect(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		cl.conns[n.ID] = conn
	}
	return cl
}

func (cl *cluster) mapNow() *bucketmap.Map {
	m, _, err := cl.st.Load(context.Background())
	if err != nil {
		cl.t.Fatal(err)
	}
	return m
}

// owner is the connection to bucket b's owner.
func (cl *cluster) owner(b bucketmap.Bucket) *pgx.Conn { return cl.conns[cl.mapNow().OwnerOf(b)] }

// rows reads bucket b's notes, as sorted lines.
func (cl *cluster) rows(b bucketmap.Bucket) []string {
	cl.t.Helper()
	lo, hi := b.Keys()
	rows, err := cl.owner(b).Query(context.Background(), `SELECT format('%s|%s|%s|%s|%s', bkey, uid, id, body, coalesce(tag, '<null>')) FROM app.notes WHERE bkey BETWEEN $1 AND $2 ORDER BY 1`, lo, hi)
	if err != nil {
		cl.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		cl.t.Fatal(err)
	}
	return out
}

// key is a key inside bucket b (the k-th from its start).
func key(b bucketmap.Bucket, k int64) int64 { lo, _ := b.Keys(); return lo + k*1_000_003 }

// seed writes n notes of 5 users into every bucket, on their owners.
func (cl *cluster) seed(n int) {
	cl.t.Helper()
	ctx := context.Background()
	m := cl.mapNow()
	for _, b := range m.BucketList() {
		for u := 0; u < 5; u++ {
			if _, err := cl.conns[m.OwnerOf(b)].Exec(ctx, `INSERT INTO app.notes (bkey, uid, id, body, tag)
				SELECT $1, $2, g, 'note ' || g || ' of ' || $2, CASE WHEN g % 3 = 0 THEN NULL ELSE 'tag' || g END FROM generate_series(1, $3) g`,
				key(b, int64(u)), fmt.Sprintf("u%d-%s", u, b), n); err != nil {
				cl.t.Fatal(err)
			}
		}
	}
}

// load writes to every bucket but the ones skipped, each write
// acknowledged recorded, until stop; a fenced refusal (a bucket paused)
// is retried.
type load struct {
	mu    sync.Mutex
	acked map[string]string // bkey|uid|id -> body
	n     atomic.Int64
	stop  chan struct{}
	done  sync.WaitGroup
	errs  atomic.Int64
	max   atomic.Int64 // the longest write, in microseconds
}

func (cl *cluster) startLoad(skip ...bucketmap.Bucket) *load {
	l := &load{acked: map[string]string{}, stop: make(chan struct{})}
	m := cl.mapNow()
	var buckets []bucketmap.Bucket
	for _, b := range m.BucketList() {
		if !contains(skip, b) {
			buckets = append(buckets, b)
		}
	}
	for w := 0; w < 2; w++ {
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			ctx := context.Background()
			conns := map[bucketmap.NodeID]*pgx.Conn{}
			for _, n := range cl.nodes {
				c, err := dbnode.Connect(ctx, n)
				if err != nil {
					l.errs.Add(1)
					return
				}
				defer c.Close(ctx)
				conns[n.ID] = c
			}
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				b := buckets[(i*7+w)%len(buckets)]
				k, uid, id := key(b, 9), fmt.Sprintf("load%d", w), i
				body := fmt.Sprintf("load %d/%d", w, i)
				start := time.Now()
				_, err := conns[m.OwnerOf(b)].Exec(ctx, `INSERT INTO app.notes (bkey, uid, id, body) VALUES ($1, $2, $3, $4)`, k, uid, id, body)
				if err != nil {
					l.errs.Add(1)
					continue
				}
				if us := time.Since(start).Microseconds(); us > l.max.Load() {
					l.max.Store(us)
				}
				l.mu.Lock()
				l.acked[fmt.Sprintf("%d|%s|%d", k, uid, id)] = body
				l.mu.Unlock()
				l.n.Add(1)
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	return l
}

func (l *load) end() { close(l.stop); l.done.Wait() }

func contains(bs []bucketmap.Bucket, b bucketmap.Bucket) bool {
	for _, x := range bs {
		if x == b {
			return true
		}
	}
	return false
}

// TestLongRestoreBuckets is issue 43's test: under write load, one
// bucket's notes are deleted and another's column cleared; both buckets
// are restored to a restore point taken before, the rows come back
// exactly, and every acknowledged write to the other buckets is kept.
// About 40 s (two backups, three scratch recoveries): make test-faults.
func TestLongRestoreBuckets(t *testing.T) {
	testenv.Long(t)
	cl := newCluster(t, 3)
	ctx := context.Background()
	cl.seed(40)
	m := cl.mapNow()
	// Two buckets on different nodes: one restore recovers each node.
	bDel, bCol := m.BucketAt(1), m.BucketAt(6)
	if m.OwnerOf(bDel) == m.OwnerOf(bCol) {
		t.Fatalf("buckets %s and %s share owner %s", bDel, bCol, m.OwnerOf(bDel))
	}
	for _, n := range cl.nodes {
		start := time.Now()
		if _, err := cl.pg.Backup(ctx, testenvStanza(t, cl, n.ID), backup.Incr); err != nil {
			t.Fatal(err)
		}
		t.Logf("backup of %s: %s", n.ID, time.Since(start).Round(time.Millisecond))
	}
	wantDel, wantCol := cl.rows(bDel), cl.rows(bCol)
	l := cl.startLoad(bDel, bCol)
	defer func() {
		select {
		case <-l.stop:
		default:
			l.end()
		}
	}()
	rp, err := backup.CreatePoint(ctx, cl.st, "before-mistake", backup.PointOptions{SwitchWAL: true, By: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore point: map version %d, cut %.1f ms, %d tries", rp.MapVersion, rp.CutMS, rp.Attempts)
	if len(rp.Nodes) != 2 || rp.Nodes["pg1"].LSN == "" || rp.Nodes["pg1"].Stanza == "" {
		t.Fatalf("point nodes: %+v", rp.Nodes)
	}

	// The mistakes.
	lo, hi := bDel.Keys()
	if _, err := cl.owner(bDel).Exec(ctx, `DELETE FROM app.notes WHERE bkey BETWEEN $1 AND $2`, lo, hi); err != nil {
		t.Fatal(err)
	}
	lo2, hi2 := bCol.Keys()
	if _, err := cl.owner(bCol).Exec(ctx, `UPDATE app.notes SET tag = NULL WHERE bkey BETWEEN $1 AND $2`, lo2, hi2); err != nil {
		t.Fatal(err)
	}
	// A row made after the point: replace takes it away.
	if _, err := cl.owner(bDel).Exec(ctx, `INSERT INTO app.notes (bkey, uid, id, body) VALUES ($1, 'late', 1, 'after the point')`, key(bDel, 2)); err != nil {
		t.Fatal(err)
	}
	if got := cl.rows(bDel); len(got) != 1 {
		t.Fatalf("bucket %s after the delete: %d rows", bDel, len(got))
	}

	opt := func(b bucketmap.Bucket, dry bool) backup.RestoreOptions {
		return backup.RestoreOptions{Bucket: b.String(), Point: rp.Name, Mode: backup.ModeReplace, DryRun: dry, PGBackRest: cl.pg, ScratchDir: scratchDir(t), By: "test",
			Progress: func(s string) { t.Log(s) }}
	}
	// The dry run tells and changes nothing.
	dry, err := backup.RestoreBucket(ctx, cl.st, opt(bDel, true))
	if err != nil {
		t.Fatal(err)
	}
	if tr := dry.Tables[0]; tr.Back != int64(len(wantDel)) || tr.Changed != 0 || tr.Gone != 1 || len(tr.GoneKeys) != 1 || !strings.Contains(tr.GoneKeys[0], "late") {
		t.Fatalf("dry run: %+v, want %d back, 0 changed, 1 gone (late)", tr, len(wantDel))
	}
	if got := cl.rows(bDel); len(got) != 1 {
		t.Fatalf("the dry run changed bucket %s: %d rows", bDel, len(got))
	}
	for _, c := range []struct {
		b    bucketmap.Bucket
		want []string
	}{{bDel, wantDel}, {bCol, wantCol}} {
		res, err := backup.RestoreBucket(ctx, cl.st, opt(c.b, false))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("bucket %s: %+v; recovery %.0f ms, stage %.0f ms, diff %.0f ms, pause %.1f ms, total %.0f ms",
			c.b, res.Tables[0], res.RecoverMS, res.StageMS, res.DiffMS, res.PauseMS, res.TotalMS)
		if got := cl.rows(c.b); strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Fatalf("bucket %s restored: %d rows, want %d exactly as at the point;\nfirst got  %v\nfirst want %v", c.b, len(got), len(c.want), first(got), first(c.want))
		}
	}
	l.end()
	t.Logf("load: %d acknowledged writes to other buckets, %d errors, longest %.1f ms", l.n.Load(), l.errs.Load(), float64(l.max.Load())/1000)
	if l.n.Load() == 0 {
		t.Fatal("the load wrote nothing")
	}
	// Every acknowledged write to another bucket is there.
	lost := 0
	var keys []string
	for k := range l.acked {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		parts := strings.Split(k, "|")
		var body string
		err := cl.anyNode(func(c *pgx.Conn) error {
			return c.QueryRow(ctx, `SELECT body FROM app.notes WHERE bkey = $1 AND uid = $2 AND id = $3`, parts[0], parts[1], parts[2]).Scan(&body)
		})
		if err != nil || body != l.acked[k] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acknowledged writes to other buckets lost", lost, len(keys))
	}
	// The restores are recorded.
	recs, err := topo.ListBucketRestores(ctx, cl.st.Session(), cl.st.Paths())
	if err != nil || len(recs) != 3 || recs[2].State != topo.RestoreDone || recs[0].State != topo.RestoreDryRun {
		t.Fatalf("restore records: %v %v", recs, err)
	}
}

// anyNode runs fn on each node until one succeeds.
func (cl *cluster) anyNode(fn func(c *pgx.Conn) error) error {
	var err error
	for _, n := range cl.nodes {
		if err = fn(cl.conns[n.ID]); err == nil {
			return nil
		}
	}
	return err
}

func first(s []string) []string { return s[:min(3, len(s))] }

func testenvStanza(t testing.TB, cl *cluster, id bucketmap.NodeID) string {
	t.Helper()
	cfg, _, err := topo.ReadBackupConfig(context.Background(), cl.st.Session(), cl.st.Paths())
	if err != nil || cfg.Stanzas[string(id)] == "" {
		t.Fatalf("no stanza for %s: %v", id, err)
	}
	return cfg.Stanzas[string(id)]
}

// TestLongRestoreUser: one user's rows come back (--user, mode missing),
// and only theirs: a neighbour in the same bucket whose rows were deleted
// after the point stays deleted, and one who wrote since keeps it.
func TestLongRestoreUser(t *testing.T) {
	testenv.Long(t)
	cl := newCluster(t, 1)
	ctx := context.Background()
	seed, err := keystream.ParseSeed(clustertest.Seed)
	if err != nil {
		t.Fatal(err)
	}
	ks, err := keystream.New(seed)
	if err != nil {
		t.Fatal(err)
	}
	m := cl.mapNow()
	// Three users of one bucket.
	var users []string
	want := m.BucketOfPrefix(ks.Prefix64("zoe"))
	for i := 0; len(users) < 3; i++ {
		u := fmt.Sprintf("u%d", i)
		if i == 0 {
			u = "zoe"
		}
		if m.BucketOfPrefix(ks.Prefix64(u)) == want {
			users = append(users, u)
		}
	}
	zoe, gone, writer := users[0], users[1], users[2]
	c := cl.owner(want)
	ukey := func(u string) int64 { return keystream.Key(ks.Prefix64(u)) }
	for _, u := range users {
		if _, err := c.Exec(ctx, `INSERT INTO app.notes (bkey, uid, id, body) SELECT $1, $2, g, 'note ' || g FROM generate_series(1, 5) g`, ukey(u), u); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cl.pg.Backup(ctx, testenvStanza(t, cl, m.OwnerOf(want)), backup.Incr); err != nil {
		t.Fatal(err)
	}
	rp, err := backup.CreatePoint(ctx, cl.st, "before", backup.PointOptions{SwitchWAL: true, By: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct {
		sql string
		uid string
	}{{`DELETE FROM app.notes WHERE bkey = $1 AND uid = $2`, zoe}, {`DELETE FROM app.notes WHERE bkey = $1 AND uid = $2`, gone},
		{`INSERT INTO app.notes (bkey, uid, id, body) VALUES ($1, $2, 99, 'since')`, writer}} {
		if _, err := c.Exec(ctx, q.sql, ukey(q.uid), q.uid); err != nil {
			t.Fatal(err)
		}
	}
	res, err := backup.RestoreBucket(ctx, cl.st, backup.RestoreOptions{User: zoe, Point: rp.Name, Mode: backup.ModeMissing, PGBackRest: cl.pg, ScratchDir: scratchDir(t), By: "test"})
	if err != nil {
		t.Fatal(err)
	}
	count := func(u string) (n int) {
		if err := c.QueryRow(ctx, `SELECT count(*) FROM app.notes WHERE bkey = $1 AND uid = $2`, ukey(u), u).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if res.Lo != ukey(zoe) || res.Hi != ukey(zoe) || res.Tables[0].Back != 5 {
		t.Fatalf("restore of %s: %+v", zoe, res)
	}
	if n := count(zoe); n != 5 {
		t.Fatalf("%s has %d notes after the restore, want 5", zoe, n)
	}
	if n := count(gone); n != 0 {
		t.Fatalf("%s, deleted since the point and not restored, has %d notes", gone, n)
	}
	if n := count(writer); n != 6 {
		t.Fatalf("%s has %d notes, want the 5 and the one written since", writer, n)
	}
}
