package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
)

func TestSanitize(t *testing.T) {
	for in, want := range map[string]string{
		"TestFoo/bar_baz#01": "testfoo_bar_baz_01",
		"///":                "test",
		"Ünïcode":            "n_code",
	} {
		if got := sanitize(in, 60); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
	if got := sanitize(strings.Repeat("a", 100), 40); len(got) != 40 {
		t.Errorf("not truncated: %d", len(got))
	}
}

func TestFaultScheduleOptIn(t *testing.T) {
	t.Setenv(FaultsEnv, "")
	var ran bool
	t.Run("off", func(t *testing.T) { Faults(t); ran = true })
	if ran {
		t.Fatal("Faults did not skip without " + FaultsEnv + "=1")
	}
	if testing.Short() {
		return
	}
	t.Setenv(FaultsEnv, "1")
	t.Run("on", func(t *testing.T) { Faults(t); ran = true })
	if !ran {
		t.Fatal("Faults skipped with " + FaultsEnv + "=1")
	}
}

func TestWaitFor(t *testing.T) {
	n := 0
	WaitFor(t, time.Second, func() bool { n++; return n >= 3 }, "three polls")
	if n != 3 {
		t.Fatalf("polled %d times", n)
	}
}

func TestReceive(t *testing.T) {
	c := make(chan int, 1)
	c <- 7
	if got := Receive(t, c, time.Second, "a value"); got != 7 {
		t.Fatalf("received %d, want 7", got)
	}
	// On timeout it fails the test (checked on a stand-in: t.Fatal would
	// end this one).
	ft := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); Receive(ft, make(chan int), 10*time.Millisecond, "nothing comes") }()
	<-done
	if ft.msg != "nothing comes" {
		t.Fatalf("on timeout: failed with %q, want the message", ft.msg)
	}
}

// fatalRecorder records Fatal's message and ends its goroutine, as t.Fatal
// does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

func TestZK(t *testing.T) {
	z := StartZK(t)
	if len(z.Servers) != 3 || z.ConnectString != strings.Join(z.Servers, ",") {
		t.Fatalf("servers %v, connect string %q", z.Servers, z.ConnectString)
	}
	if !strings.HasPrefix(z.Root, TestRootParent+"/testzk-") {
		t.Fatalf("root %q", z.Root)
	}
	conn := z.Dial(t)
	if _, err := conn.Create(z.Path("a"), []byte("x"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Create(z.Path("a", "b"), nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	data, _, err := conn.Get(z.Path("a"))
	if err != nil || string(data) != "x" {
		t.Fatalf("get: %q %v", data, err)
	}
	leader, err := z.Leader()
	if err != nil {
		t.Fatal(err)
	}
	followers := 0
	for i := range z.Servers {
		m, err := z.Mode(i)
		if err != nil {
			t.Fatal(err)
		}
		if i != leader && m == "follower" {
			followers++
		}
	}
	if followers != 2 {
		t.Fatalf("leader %d, %d followers", leader, followers)
	}
	conf, err := z.FourLetterWord(0, "conf")
	if err != nil || !strings.Contains(conf, "maxSessionTimeout=30000") || !strings.Contains(conf, "tickTime=200") ||
		!strings.Contains(conf, "syncLimit=10") {
		t.Fatalf("conf: %v\n%s", err, conf)
	}
	// Cleanup deletes nodes whatever their ACLs (as the ZooKeeper superuser).
	locked := zk.DigestACL(zk.PermAll, "someone", "secret")
	if _, err := conn.Create(z.Path("locked"), nil, 0, locked); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Create(z.Path("locked", "child"), nil, 0, locked); err == nil || !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("create under an ACL-protected node without auth: %v", err)
	}
	if z.SuperAuth == "" {
		t.Fatal("no SuperAuth")
	}
	// Control needs Exclusive.
	if err := z.Kill(0); !errors.Is(err, ErrNotExclusive) {
		t.Fatalf("Kill without Exclusive: %v", err)
	}
}

// TestZKIsolationAndCleanup: every StartZK gets its own root, removed with
// everything under it when the (sub)test ends.
func TestZKIsolationAndCleanup(t *testing.T) {
	skipIfShort(t) // its subtests would skip, leaving nothing to compare
	var roots []string
	for i := 0; i < 2; i++ {
		t.Run("sub", func(t *testing.T) {
			z := StartZK(t)
			roots = append(roots, z.Root)
			conn := z.Dial(t)
			if _, err := conn.Create(z.Path("child"), nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
				t.Fatal(err)
			}
		})
	}
	if len(roots) != 2 || roots[0] == roots[1] {
		t.Fatalf("roots %v", roots)
	}
	z := StartZK(t)
	conn := z.Dial(t)
	for _, r := range roots {
		ok, _, err := conn.Exists(r)
		if err != nil || ok {
			t.Fatalf("root %s still exists after its test (err %v)", r, err)
		}
	}
}

func TestPG(t *testing.T) {
	pg := StartPG(t)
	if len(pg.Nodes) < 3 {
		t.Fatalf("%d nodes", len(pg.Nodes))
	}
	ctx := t.Context()
	t.Setenv("PGPASSFILE", "/nonexistent")
	t.Setenv("PGPASSWORD", "")
	for _, n := range pg.Nodes {
		// Password authentication is enforced over TCP, by the PgBouncer
		// too.
		if c, err := pgx.Connect(ctx, n.DSN); err == nil {
			c.Close(ctx)
			t.Fatalf("%s: connected without a password", n.Name)
		}
		if c, err := pgx.Connect(ctx, n.PoolDSN); err == nil {
			c.Close(ctx)
			t.Fatalf("%s: connected to its PgBouncer without a password", n.Name)
		}
		// The pooler reaches the test's own database, as postgres, with
		// the DSN's TLS parameters.
		if n.PoolPort != n.Port+2000 || n.PoolDSN != strings.Replace(n.DSN, ":"+strconv.Itoa(n.Port)+"/", ":"+strconv.Itoa(n.PoolPort)+"/", 1) {
			t.Fatalf("%s: pool port %d, DSN %q (server's %q)", n.Name, n.PoolPort, n.PoolDSN, n.DSN)
		}
		cfg, err := pgx.ParseConfig(n.PoolDSNWithPassword)
		if err != nil {
			t.Fatal(err)
		}
		cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatalf("%s: through its PgBouncer: %v", n.Name, err)
		}
		var db, user string
		err = c.QueryRow(ctx, "SELECT current_database(), current_user").Scan(&db, &user)
		c.Close(ctx)
		if err != nil || db != n.Database || user != n.User {
			t.Fatalf("%s through its PgBouncer: database %q, user %q (%v)", n.Name, db, user, err)
		}
	}
	for i, n := range pg.Nodes {
		if n.Index != i || n.Database == "" || strings.Contains(n.DSN, n.Password) {
			t.Fatalf("node %+v", n)
		}
		if i > 0 && n.Database != pg.Nodes[0].Database {
			t.Fatalf("database names differ across nodes: %s vs %s", n.Database, pg.Nodes[0].Database)
		}
		// The password from PasswordFile works, with the password-less DSN.
		b, err := os.ReadFile(n.PasswordFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := pgx.ParseConfig(n.DSN)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Password = strings.TrimSpace(string(b))
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		var db, walLevel string
		if err := conn.QueryRow(ctx, "SELECT current_database(), current_setting('wal_level')").Scan(&db, &walLevel); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
		if db != n.Database || walLevel != "logical" {
			t.Fatalf("%s: database %s wal_level %s", n.Name, db, walLevel)
		}
		// And so does the pgpass file.
		t.Setenv("PGPASSFILE", n.PGPassFile)
		cfg2, err := pgx.ParseConfig(n.DSN)
		if err != nil {
			t.Fatal(err)
		}
		if cfg2.Password != n.Password {
			t.Fatalf("%s: PGPASSFILE not picked up", n.Name)
		}
		c := n.Conn(t)
		if _, err := c.Exec(ctx, "CREATE TABLE kv (k text PRIMARY KEY, v text)"); err != nil {
			t.Fatal(err)
		}
	}
	if err := pg.Nodes[0].Stop(); !errors.Is(err, ErrNotExclusive) {
		t.Fatalf("Stop without Exclusive: %v", err)
	}
}

// TestPGIsolationAndCleanup: databases differ per StartPG and are dropped at
// the end of the test, subscriptions and slots included.
func TestPGIsolationAndCleanup(t *testing.T) {
	skipIfShort(t) // its subtests would skip, leaving nothing to compare
	var dbs []string
	t.Run("a", func(t *testing.T) {
		pg := StartPG(t)
		dbs = append(dbs, pg.Nodes[0].Database)
		// Logical replication pg1 -> pg2 inside the test's databases; the
		// cleanup must be able to drop both databases anyway.
		ctx := t.Context()
		src, dst := pg.Nodes[0].Conn(t), pg.Nodes[1].Conn(t)
		for _, c := range []*pgx.Conn{src, dst} {
			if _, err := c.Exec(ctx, "CREATE TABLE kv (k text PRIMARY KEY, v text)"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := src.Exec(ctx, "CREATE PUBLICATION pub FOR TABLE kv"); err != nil {
			t.Fatal(err)
		}
		if _, err := src.Exec(ctx, "INSERT INTO kv VALUES ('a', '1')"); err != nil {
			t.Fatal(err)
		}
		connInfo := "host=127.0.0.1 port=" + strconv.Itoa(pg.Nodes[0].Port) + " user=postgres password=" + pg.Nodes[0].Password + " dbname=" + pg.Nodes[0].Database
		// Replication slots are cluster-wide: name the subscription (and so
		// its slot) after the test's database to keep concurrent tests apart.
		sub := pgx.Identifier{"sub_" + pg.Nodes[1].Database}.Sanitize()
		if _, err := dst.Exec(ctx, "CREATE SUBSCRIPTION "+sub+" CONNECTION '"+connInfo+"' PUBLICATION pub"); err != nil {
			t.Fatal(err)
		}
		WaitFor(t, 30*time.Second, func() bool {
			var n int
			return dst.QueryRow(ctx, "SELECT count(*) FROM kv").Scan(&n) == nil && n == 1
		}, "row replicated pg1 -> pg2")
	})
	t.Run("b", func(t *testing.T) {
		pg := StartPG(t)
		dbs = append(dbs, pg.Nodes[0].Database)
	})
	if len(dbs) != 2 || dbs[0] == dbs[1] {
		t.Fatalf("databases %v", dbs)
	}
	pg := StartPG(t)
	ctx := t.Context()
	for _, n := range pg.Nodes {
		conn, err := pgx.Connect(ctx, n.AdminDSN)
		if err != nil {
			t.Fatal(err)
		}
		var left, slots int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = ANY($1)", dbs).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = ANY($1)", dbs).Scan(&slots); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
		if left != 0 || slots != 0 {
			t.Fatalf("%s: %d test databases and %d slots left after cleanup", n.Name, left, slots)
		}
	}
}

// TestFaultsExclusiveKillFollower kills a ZooKeeper follower: the ensemble keeps
// serving with two servers, and Start brings the third back.
func TestFaultsExclusiveKillFollower(t *testing.T) {
	Faults(t)       // drains every other test process while it runs
	z := StartZK(t) // shared first, then exclusive: must not deadlock
	Exclusive(t)
	Exclusive(t) // no-op
	f, err := z.Follower()
	if err != nil {
		t.Fatal(err)
	}
	conn := z.Dial(t)
	if err := z.Kill(f); err != nil {
		t.Fatal(err)
	}
	if _, err := z.Mode(f); err == nil {
		t.Fatalf("server %d still answers after Kill", f)
	}
	// Quorum (2 of 3) still serves writes.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, err := conn.Create(z.Path("during"), nil, 0, zk.WorldACL(zk.PermAll))
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("write with one follower down: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := z.Leader(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := z.Start(f); err != nil {
		t.Fatal(err)
	}
	t.Logf("zk%d rejoined in %v", f+1, time.Since(start))
	if err := z.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	if m, err := z.Mode(f); err != nil || (m != "follower" && m != "leader") {
		t.Fatalf("server %d after Start: %q %v", f, m, err)
	}
}

// TestFaultsExclusiveKillLeaderRestoredAtCleanup kills the leader and leaves it to
// Exclusive's cleanup to restart it; the next test finds a whole ensemble.
func TestFaultsExclusiveKillLeaderRestoredAtCleanup(t *testing.T) {
	Faults(t) // drains every other test process while it runs
	t.Run("kill", func(t *testing.T) {
		Exclusive(t)
		z := StartZK(t) // exclusive first, then StartZK: fine too
		l, err := z.Leader()
		if err != nil {
			t.Fatal(err)
		}
		if err := z.Kill(l); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		WaitFor(t, 30*time.Second, func() bool {
			nl, err := z.Leader()
			return err == nil && nl != l
		}, "a new leader")
		t.Logf("new leader elected in %v", time.Since(start))
	})
	z := StartZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := z.WaitHealthy(ctx); err != nil {
		t.Fatalf("environment not restored after the exclusive test: %v", err)
	}
}

func TestFaultsExclusivePGStopStart(t *testing.T) {
	Faults(t) // drains every other test process while it runs
	Exclusive(t)
	pg := StartPG(t)
	n := pg.Nodes[1]
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if c, err := pgx.Connect(ctx, n.DSNWithPassword); err == nil {
		c.Close(ctx)
		t.Fatal("connected to a stopped node")
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	c := n.Conn(t)
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("after restart: %v", err)
	}
	// Leave node 3 stopped: the cleanup restarts it (and still drops the
	// test database on it).
	if err := pg.Nodes[2].Stop(); err != nil {
		t.Fatal(err)
	}
}

func TestSubtestCoveredByParent(t *testing.T) {
	// Documented misuse: a subtest cannot become exclusive while its parent
	// holds the shared lock. We only check the detection, without running
	// Exclusive (which would call t.Fatal on this test's own subtest).
	StartZK(t)
	t.Run("sub", func(t *testing.T) {
		st := stateFor(t)
		statesMu.Lock()
		a := st.ancestor()
		statesMu.Unlock()
		if a == nil || a.name != "TestSubtestCoveredByParent" {
			t.Fatalf("ancestor = %v", a)
		}
	})
}

// A SIGSTOPped leader keeps its sockets open and answers nothing. The
// followers elect another leader after syncLimit × tickTime; until then no
// quorum answers. The test measures that window (logged for
// docs/zookeeper-layout.md) and checks that the two others serve writes
// again and that the frozen server rejoins once continued.
func TestFaultsFrozenLeaderElection(t *testing.T) {
	Faults(t)
	Exclusive(t)
	z := StartZK(t)
	if err := z.StartAll(); err != nil { // brings an older zoo.cfg up to date
		t.Fatal(err)
	}
	conf, err := z.FourLetterWord(0, "conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(conf, "\n") {
		if strings.HasPrefix(l, "syncLimit=") || strings.HasPrefix(l, "tickTime=") {
			t.Log(l)
		}
	}
	leader, err := z.Leader()
	if err != nil {
		t.Fatal(err)
	}
	var others []int
	for i := range z.Servers {
		if i != leader {
			others = append(others, i)
		}
	}
	start := time.Now()
	z.Freeze(t, leader)
	var noticed, elected time.Duration
	WaitFor(t, 60*time.Second, func() bool {
		leaders, followers := 0, 0
		for _, i := range others {
			switch m, _ := z.Mode(i); m {
			case "leader":
				leaders++
			case "follower":
				followers++
			}
		}
		if noticed == 0 && followers < len(others) {
			noticed = time.Since(start)
		}
		if leaders == 1 && followers == 1 {
			elected = time.Since(start)
			return true
		}
		return false
	}, "a new leader among the servers left")
	t.Logf("frozen leader zk%d: followers gave it up after %s, a new quorum served after %s (no-quorum window)",
		leader+1, noticed.Round(10*time.Millisecond), elected.Round(10*time.Millisecond))
	conn, _, err := zk.Connect([]string{z.Servers[others[0]], z.Servers[others[1]]}, 4*time.Second, zk.WithLogger(nopLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	WaitFor(t, 30*time.Second, func() bool {
		_, err := conn.Create(z.Path("after"), nil, 0, zk.WorldACL(zk.PermAll))
		return err == nil || errors.Is(err, zk.ErrNodeExists)
	}, "a write through the new quorum")
	if err := z.Thaw(leader); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := z.WaitHealthy(ctx); err != nil {
		t.Fatalf("the continued server did not rejoin: %v", err)
	}
}
