package topo

import (
	"context"
	"errors"
	"path"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/zksession"
)

var (
	testAdmin  = zksession.Credential{User: "admin", Password: "admin-secret"}
	testReader = zksession.Credential{User: "reader", Password: "reader-secret"}
)

// securedCluster builds an ACL'd cluster with one of every kind of znode,
// each written by the identity that writes it in production: the admin
// (shardctl, mover, GC, rebalancer) and the reader (supervisor, router).
func securedCluster(t *testing.T, ctx context.Context, z *testenv.ZK) (p Paths, as, rs *zksession.Session) {
	t.Helper()
	as = zktest.Session(t, zksession.Config{Connect: z.ConnectString, Auth: []zksession.Credential{testAdmin}})
	rs = zktest.Session(t, zksession.Config{Connect: z.ConnectString, Auth: []zksession.Credential{testReader}})
	p = MustPaths(z.Root, "sec")
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("create cluster", CreateCluster(ctx, as, p, testCluster("sec"), []byte(`{"v":1}`), zksession.ClusterACL(&testAdmin, &testReader)))
	_, _, err := SetPoolConfig(ctx, as, p, "web", &PoolConfig{Version: PoolConfigVersion, Command: "/bin/app", Workers: 1}, -1)
	must("pool set", err)
	_, err = RegisterPoolMember(ctx, rs, p, "web", PoolMember{Version: PoolMemberVersion, Member: "sv1", State: "serving"})
	must("supervisor member record", err)
	must("pool status", WritePoolStatus(ctx, rs, p, "web", PoolStatus{Version: PoolStatusVersion, Member: "sv1", Result: SwapOK}))
	_, err = RegisterRouter(ctx, rs, p, RouterMember{Version: RouterMemberVersion, ID: "r1", MapVersion: 1})
	must("router member record", err)
	must("move record", CreateMove(ctx, as, p, &MoveRecord{Version: MoveVersion, ID: "m1", State: MoveCopy}))
	_, err = LockMoveRunner(ctx, as, p, "m1", "host-1")
	must("move runner lock", err)
	_, err = LockGC(ctx, as, p, []byte(`{"host":"h","pid":1}`))
	must("gc lock", err)
	_, err = LockRebalance(ctx, as, p, []byte("host-1"), nil)
	must("rebalance lock", err)
	must("rebalance record", WriteRebalance(ctx, as, p, RebalanceRecord{Version: RebalanceVersion, At: time.Now().UTC()}))
	return p, as, rs
}

// rawConn is a plain ZooKeeper connection authenticated as exactly the
// given identities (none: anonymous), as zkCli.sh would be.
func rawConn(t *testing.T, z *testenv.ZK, creds ...zksession.Credential) *zk.Conn {
	t.Helper()
	conn, events, err := zk.Connect(z.Servers, 4*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	deadline := time.After(20 * time.Second)
	for conn.State() != zk.StateHasSession {
		select {
		case <-events:
		case <-deadline:
			t.Fatal("raw connection did not get a session")
		}
	}
	for _, c := range creds {
		if err := conn.AddAuth("digest", []byte(c.User+":"+c.Password)); err != nil {
			t.Fatal(err)
		}
	}
	return conn
}

// tree lists p and every znode below it, parents first.
func tree(t *testing.T, ctx context.Context, s *zksession.Session, p string) []string {
	t.Helper()
	out := []string{p}
	kids, _, err := s.Children(ctx, p)
	if err != nil {
		t.Fatalf("listing %s: %v", p, err)
	}
	sort.Strings(kids)
	for _, k := range kids {
		out = append(out, tree(t, ctx, s, path.Join(p, k))...)
	}
	return out
}

// attempt tries op on at and says whether the ACL let it through. Writes
// use a version that cannot match: ZooKeeper checks the ACL first, so
// NoAuth means refused and BadVersion means the ACL allowed it, without
// the test destroying its own fixture. A created child is real, and
// removed again by cleanup.
func attempt(conn *zk.Conn, op, at string, cleanup func(string)) (allowed bool, err error) {
	const never = 1 << 30
	switch op {
	case "get":
		_, _, err = conn.Get(at)
	case "set":
		_, err = conn.Set(at, []byte(`{"version":1,"attack":true}`), never)
	case "create":
		child := at + "/attack"
		_, err = conn.Create(child, []byte("x"), 0, zk.WorldACL(zk.PermAll))
		if err == nil {
			cleanup(child)
		}
	case "delete":
		err = conn.Delete(at, never)
	case "setacl":
		_, err = conn.SetACL(at, zk.WorldACL(zk.PermAll), never)
	}
	switch {
	case errors.Is(err, zk.ErrNoAuth):
		return false, nil
	case err == nil, errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNoChildrenForEphemerals):
		return true, nil
	}
	return false, err
}

// Every znode of an ACL'd cluster refuses anonymous access and every write
// of the reader identity except those the design allows: create and delete
// children of the two member directories, and set member records and the
// pool status. The set of znodes is checked too, so that the walk covers
// one of every kind.
func TestIntegrationACLAttacks(t *testing.T) {
	z := testenv.StartZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, as, _ := securedCluster(t, ctx, z)

	nodes := tree(t, ctx, as, p.Cluster())
	rel := func(at string) string { return strings.TrimPrefix(strings.TrimPrefix(at, p.Cluster()), "/") }
	var names []string
	for _, n := range nodes {
		names = append(names, rel(n))
	}
	for _, want := range []string{"", "map", "acl", "rebalance", "pools", "pools/web", "pools/web/config", "pools/web/status",
		"pools/web/members", "pools/web/members/sv1", "routers", "routers/r1", "moves", "moves/m1", "moves/m1/runner",
		"locks", "locks/gc", "locks/gc/holder", "locks/rebalance"} {
		if !contains(names, want) {
			t.Fatalf("the fixture has no %q; the walk would miss a kind of znode (have %q)", want, names)
		}
	}

	// The admin reads everything, readers' records included.
	for _, at := range nodes {
		if _, _, err := as.Get(ctx, at); err != nil {
			t.Errorf("admin cannot read %s: %v", at, err)
		}
	}

	readerWrites := map[string]bool{ // rel path + " " + op
		"routers create": true, "routers/r1 delete": true, "routers/r1 set": true,
		"pools/web/members create": true, "pools/web/members/sv1 delete": true, "pools/web/members/sv1 set": true,
		"pools/web/status set": true,
	}
	admin := rawConn(t, z, testAdmin)
	cleanup := func(at string) {
		if err := admin.Delete(at, -1); err != nil {
			t.Errorf("cleanup of %s: %v", at, err)
		}
	}
	attempts := 0
	for _, who := range []struct {
		name string
		conn *zk.Conn
	}{{"anonymous", rawConn(t, z)}, {"reader", rawConn(t, z, testReader)}} {
		for _, at := range nodes {
			for _, op := range []string{"get", "set", "create", "delete", "setacl"} {
				r := rel(at)
				if r == "" && op == "delete" {
					// The cluster's own znode sits in the shared root, which
					// is open; it cannot be deleted while it has children,
					// and those are protected (checked below).
					if err := who.conn.Delete(at, -1); !errors.Is(err, zk.ErrNotEmpty) && !errors.Is(err, zk.ErrNoAuth) {
						t.Errorf("%s deleting the cluster znode: %v", who.name, err)
					}
					continue
				}
				want := who.name == "reader" && (op == "get" || readerWrites[r+" "+op])
				attempts++
				got, err := attempt(who.conn, op, at, cleanup)
				if err != nil {
					t.Errorf("%s %s %s: unexpected error %v", who.name, op, at, err)
					continue
				}
				if got != want {
					verdict := map[bool]string{true: "allowed", false: "refused"}
					t.Errorf("%s %s %s: %s, want %s", who.name, op, at, verdict[got], verdict[want])
				}
			}
		}
	}

	t.Logf("%d attempts on %d znodes as anonymous and as the reader", attempts, len(nodes))

	// The writes the design gives the reader, for real: its own records
	// and a member directory's children.
	reader := rawConn(t, z, testReader)
	for _, at := range []string{p.PoolMember("web", "sv1"), p.Router("r1"), p.PoolStatus("web")} {
		data, _, err := reader.Get(at)
		if err != nil {
			t.Fatalf("reader get %s: %v", at, err)
		}
		if _, err := reader.Set(at, data, -1); err != nil {
			t.Errorf("reader set %s: %v", at, err)
		}
	}
	for _, dir := range []string{p.Routers(), p.PoolMembers("web")} {
		at := dir + "/extra"
		acl := append(zk.DigestACL(zk.PermRead|zk.PermWrite, testReader.User, testReader.Password), zk.DigestACL(zk.PermAll, testAdmin.User, testAdmin.Password)...)
		if _, err := reader.Create(at, []byte("{}"), zk.FlagEphemeral, acl); err != nil {
			t.Errorf("reader create %s: %v", at, err)
		} else if err := reader.Delete(at, -1); err != nil {
			t.Errorf("reader delete %s: %v", at, err)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
