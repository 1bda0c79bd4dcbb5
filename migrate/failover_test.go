package migrate

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
)

// groupFixture is a cluster of a plain node (pg1) and a Patroni group of a
// primary and a synchronous standby (pg2), at level 2: pg1 owns buckets
// 0-1, pg2 2-3.
func groupFixture(t *testing.T) (*fixture, *testenv.PGNode) {
	t.Helper()
	plain := testenv.StartPGNodes(t, 1)
	groups := testenv.StartPGGroups(t, 1)
	f := newFixtureOn(t, 2, &testenv.PG{Nodes: []*testenv.PGNode{plain.Nodes[0], groups.Nodes[0]}})
	return f, groups.Nodes[0]
}

// A move whose source or target group loses its primary (SIGKILL of the
// postmaster, its children and Patroni) in any state: the move aborts
// cleanly (the new primary has no slot, or may lack what the old one
// confirmed), starts again on the new primary and completes; no
// acknowledged write is lost, nothing is left behind, and the old primary
// rejoins as a standby.
func TestFaultsMoveThroughFailover(t *testing.T) {
	testenv.Faults(t)
	testenv.Exclusive(t)
	for _, tc := range []struct {
		name   string
		bucket uint32
		to     bucketmap.NodeID
		killAt string // the state on entering which the group's primary dies
	}{
		{"source-in-copy", 2, "pg1", topo.MoveCopy},
		{"target-in-catchup", 0, "pg2", topo.MoveCatchup},
		{"source-in-fence", 3, "pg1", topo.MoveFence},
		{"target-in-barrier", 1, "pg2", topo.MoveBarrier}, // inside the write pause
		{"source-in-teardown", 3, "pg1", topo.MoveTeardown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, group := groupFixture(t)
			base := f.seedRows("seed", 200)
			l := f.startLoad(4, 100)
			testenv.WaitFor(t, 30*time.Second, func() bool { return l.writes.Load() >= 20 }, "writes acknowledged before the move")
			var once sync.Once
			var killed string
			var killedAt time.Time
			progress := func(p Progress) {
				if p.Message == tc.killAt {
					once.Do(func() {
						killed = group.KillPrimary(t)
						killedAt = time.Now()
					})
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			first := ""
			rec, err := f.mover(Options{Progress: func(p Progress) {
				if first == "" && p.Move != nil {
					first = p.Move.ID
				}
				progress(p)
			}}).Move(ctx, tc.bucket, tc.to, false)
			if err != nil {
				t.Fatalf("move through a failover of %s: %v", killed, err)
			}
			if killed == "" {
				t.Fatalf("the primary was never killed (no %s step)", tc.killAt)
			}
			t.Logf("killed %s on entering %s; move %s ended %s %.1fs after the kill (first attempt %s)", killed, tc.killAt, rec.ID, rec.State, time.Since(killedAt).Seconds(), first)
			if rec.State != topo.MoveDone {
				t.Fatalf("move ended %s: %s", rec.State, rec.Error)
			}
			if tc.killAt != topo.MoveTeardown && rec.ID == first {
				t.Fatalf("a failover before the flip did not restart the move: %s", rec.ID)
			}
			if m := f.mapNow(); m.Owner(tc.bucket) != tc.to || m.Meta(tc.bucket).State != bucketmap.BucketActive {
				t.Fatalf("bucket %d after the move: %s %+v", tc.bucket, m.Owner(tc.bucket), m.Meta(tc.bucket))
			}
			n := l.writes.Load()
			testenv.WaitFor(t, 60*time.Second, func() bool { return l.writes.Load() >= n+20 }, "writes acknowledged after the move")
			acked := l.finish()
			withSeeded(acked, base)
			f.checkAcked(acked, l.maybe)
			t.Logf("%d writes acknowledged, %d gave up (a write that waits out the failover)", l.writes.Load(), l.failed.Load())
			if left := f.leftovers(); len(left) > 0 {
				t.Fatalf("left behind: %v", left)
			}
			group.StartMembers(t)
			if st := group.Streaming(t); len(st) != 1 {
				t.Fatalf("after pg-start the group has %d streaming standbys: %v", len(st), st)
			}
			// No move's slot is left on any member, the rejoined old
			// primary included.
			for _, member := range group.Members {
				c, err := pgx.Connect(ctx, "postgres://postgres@"+member+"/postgres?"+testenv.SSLParams()+"&password="+url.QueryEscape(group.Password))
				if err != nil {
					t.Fatal(err)
				}
				rows, _ := c.Query(ctx, "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'sv\\_%'")
				slots, err := pgx.CollectRows(rows, pgx.RowTo[string])
				c.Close(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if len(slots) > 0 {
					t.Errorf("member %s keeps the slots %v", member, slots)
				}
			}
		})
	}
}

// A primary cut off from ZooKeeper (its Patroni's connections to the
// ensemble cut, its PostgreSQL and REST API still reachable):
//   - with failsafe_mode (the devenv's and the recommended setting) it
//     stays primary, since it reaches every member, and no standby is
//     promoted;
//   - without it Patroni demotes it (it cannot renew its leader key within
//     retry_timeout) before the key expires, and then promotes the standby.
//
// Either way no write is acknowledged by two primaries (every write that
// the old primary acknowledged came before the first one the new primary
// acknowledged), and every acknowledged write is on the owner afterwards.
func TestFaultsPrimaryCutOffFromZooKeeper(t *testing.T) {
	testenv.Faults(t)
	testenv.Exclusive(t)
	for _, failsafe := range []bool{true, false} {
		t.Run(fmt.Sprintf("failsafe=%v", failsafe), func(t *testing.T) {
			f, group := groupFixture(t)
			if !failsafe {
				group.SetPatroniConfig(t, `{"failsafe_mode": false}`)
				t.Cleanup(func() { group.SetPatroniConfig(t, `{"failsafe_mode": true}`) })
			}
			// Writers to users on the group, each ack recorded with the
			// server port that gave it.
			var uids []string
			m := f.mapNow()
			for i := 0; len(uids) < 40; i++ {
				uid := fmt.Sprintf("cut-%d", i)
				if m.OwnerOf(m.BucketOf(f.ks, uid)) == "pg2" {
					uids = append(uids, uid)
				}
			}
			type ack struct {
				port int
				at   time.Time
			}
			var (
				mu    sync.Mutex
				acks  []ack
				acked = map[string]int64{}
				maybe = map[string]int64{} // failed without an answer: may have committed
				stop  = make(chan struct{})
				wg    sync.WaitGroup
			)
			for w := 0; w < 4; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for v := int64(1); ; v++ {
						select {
						case <-stop:
							return
						default:
						}
						// Each writer its own users: two writers upserting
						// one user race, and the last ack need not be the
						// last commit.
						uid := uids[w*10+int(v%10)]
						key := keystream.Key(f.ks.Prefix64(uid))
						var port int
						ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
						err := f.r.Do(ctx, uid, func(ctx context.Context, pool *pgxpool.Pool, _ router.Route) error {
							return pool.QueryRow(ctx, `INSERT INTO app.kv (bkey, uid, v) VALUES ($1, $2, $3)
								ON CONFLICT (bkey, uid) DO UPDATE SET v = EXCLUDED.v RETURNING inet_server_port()`, key, uid, v).Scan(&port)
						})
						cancel()
						if err != nil {
							mu.Lock()
							maybe[uid] = max(maybe[uid], v)
							mu.Unlock()
							time.Sleep(20 * time.Millisecond)
							continue
						}
						mu.Lock()
						acks = append(acks, ack{port, time.Now()})
						acked[uid] = v
						mu.Unlock()
					}
				}()
			}
			time.Sleep(time.Second)
			old := group.PrimaryMember(t)
			group.CutZK(t, old)
			cutAt := time.Now()
			time.Sleep(25 * time.Second) // beyond ttl (10 s) + retry_timeout (4 s)
			group.HealZK(t, old)
			group.StartMembers(t) // every member streaming again
			time.Sleep(2 * time.Second)
			close(stop)
			wg.Wait()

			oldPort := group.Members[old-1]
			var lastOld, firstNew time.Time
			ports := map[int]int{}
			for _, a := range acks {
				ports[a.port]++
				if strings.HasSuffix(oldPort, fmt.Sprintf(":%d", a.port)) {
					if a.at.After(lastOld) {
						lastOld = a.at
					}
				} else if firstNew.IsZero() || a.at.Before(firstNew) {
					firstNew = a.at
				}
			}
			other := "none by another"
			if !firstNew.IsZero() {
				other = fmt.Sprintf("first by another %s after", firstNew.Sub(cutAt).Round(time.Millisecond))
			}
			t.Logf("cut %s (%s) off from ZooKeeper; acks by server port: %v; last by the old primary %s after the cut, %s",
				group.Name, oldPort, ports, lastOld.Sub(cutAt).Round(time.Millisecond), other)
			if !firstNew.IsZero() && lastOld.After(firstNew) {
				t.Fatalf("two primaries acknowledged writes: the old one at %s, after the new one's first at %s", lastOld.Format(time.StampMilli), firstNew.Format(time.StampMilli))
			}
			if failsafe && !firstNew.IsZero() {
				t.Fatalf("with failsafe_mode the primary reaching every member lost its role")
			}
			if !failsafe && firstNew.IsZero() {
				t.Fatalf("without failsafe_mode the primary cut off from ZooKeeper was not replaced")
			}
			f.checkAcked(acked, maybe)
		})
	}
}

// The trust boundary between Patroni and ZooKeeper: Patroni's records are
// world-writable (Patroni 3.0 sets ACLs only for x509), so nothing secret
// may be in them. No znode of the group holds the superuser/replication
// password, after a move and a failover have written everything they
// write; and the map, which every reader sees, holds no password either.
func TestFaultsNoPasswordInZooKeeper(t *testing.T) {
	testenv.Faults(t)
	testenv.Exclusive(t)
	f, group := groupFixture(t)
	if _, err := f.mover(Options{}).Move(context.Background(), 2, "pg1", false); err != nil {
		t.Fatal(err)
	}
	group.KillPrimary(t)
	group.Primary(t)
	group.StartMembers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var walk func(p string) int
	walk = func(p string) int {
		data, _, err := f.s.Get(ctx, p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if strings.Contains(string(data), group.Password) {
			t.Errorf("znode %s holds the password", p)
		}
		kids, _, err := f.s.Children(ctx, p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		n := 1
		for _, k := range kids {
			n += walk(strings.TrimSuffix(p, "/") + "/" + k)
		}
		return n
	}
	n := walk(strings.TrimSuffix(group.PatroniNamespace, "/") + "/" + group.PatroniScope)
	n += walk(f.st.Paths().Cluster())
	if n < 10 {
		t.Fatalf("walked only %d znodes", n)
	}
	t.Logf("%d znodes of the group and the cluster, none with the password", n)
}
