package topo

import (
	"context"
	"errors"
	"path"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/zksession"
)

func TestKindOf(t *testing.T) {
	p := MustPaths("/sv", "c1")
	for at, want := range map[string]NodeKind{
		"/sv/c1":                        KindRecord,
		"/sv/c1/map":                    KindRecord,
		"/sv/c1/acl":                    KindRecord,
		"/sv/c1/rebalance":              KindRecord,
		"/sv/c1/pools":                  KindRecord,
		"/sv/c1/pools/web":              KindRecord,
		"/sv/c1/pools/web/config":       KindRecord,
		"/sv/c1/pools/web/status":       KindReaderRecord,
		"/sv/c1/pools/web/members":      KindMemberDir,
		"/sv/c1/pools/web/members/h1":   KindMemberRecord,
		"/sv/c1/pools/web/members/h1/x": KindRecord,
		"/sv/c1/pools/status":           KindRecord,
		"/sv/c1/routers":                KindMemberDir,
		"/sv/c1/routers/r1":             KindMemberRecord,
		"/sv/c1/moves/m1/runner":        KindRecord,
		"/sv/c1/locks/gc/holder":        KindRecord,
		"/sv/c1/unknown/thing":          KindRecord,
		"/sv":                           KindOutside,
		"/sv/.probes/h-1":               KindOutside,
		"/sv/c10/routers":               KindOutside,
	} {
		if got := p.KindOf(at); got != want {
			t.Errorf("KindOf(%s) = %s, want %s", at, got, want)
		}
	}
}

func mustACL(t *testing.T, r *ACLRule, k NodeKind) []zk.ACL {
	t.Helper()
	acl, err := r.ACL(k)
	if err != nil {
		t.Fatalf("%s: %v", k, err)
	}
	return acl
}

// The rule derived from the ACL init gives the cluster's znode is the one
// init always gave its directories, and the records readers write belong
// to the admin's records identity.
func TestACLRuleDerivation(t *testing.T) {
	admin, reader := testAdmin, testReader
	r := ClusterACLRule(&admin, &reader)
	if r.Open() {
		t.Fatal("a cluster with an admin is open")
	}
	if got := mustACL(t, r, KindRecord); !slices.Equal(got, zksession.ClusterACL(&admin, &reader)) {
		t.Errorf("record: %s", FormatACL(got))
	}
	if got := mustACL(t, r, KindMemberDir); !slices.Equal(got, zksession.MemberACL(&admin, &reader)) {
		t.Errorf("member dir: %s", FormatACL(got))
	}
	rc, _ := zksession.RecordsCredential(admin.DigestID())
	want := append(zk.DigestACL(zk.PermAll, rc.User, rc.Password), zk.DigestACL(zk.PermRead|zk.PermWrite, reader.User, reader.Password)...)
	if got := mustACL(t, r, KindReaderRecord); !slices.Equal(got, want) {
		t.Errorf("reader record: %s, want %s", FormatACL(got), FormatACL(want))
	}
	if got := mustACL(t, r, KindOutside); !slices.Equal(got, OpenACL()) {
		t.Errorf("outside: %s", FormatACL(got))
	}
	if s := FormatACL(mustACL(t, r, KindReaderRecord)); !strings.Contains(s, "digest:admin+records:") || !strings.Contains(s, ":rw") || strings.Contains(s, admin.DigestID()) {
		t.Errorf("reader record %s: owned by the records identity, never naming the admin's hash", s)
	}

	// No reader identity: anyone reads, and the reader's rights go to
	// anyone.
	r = ClusterACLRule(&admin, nil)
	for k, perms := range map[NodeKind]int32{KindRecord: zk.PermRead, KindMemberDir: zk.PermRead | zk.PermCreate | zk.PermDelete, KindReaderRecord: zk.PermRead | zk.PermWrite} {
		acl := mustACL(t, r, k)
		if w := acl[len(acl)-1]; !isWorld(w) || w.Perms != perms {
			t.Errorf("no reader, %s: %s", k, FormatACL(acl))
		}
	}

	// No admin: open.
	r = ClusterACLRule(nil, nil)
	for _, k := range []NodeKind{KindRecord, KindMemberDir, KindReaderRecord} {
		if got := mustACL(t, r, k); !r.Open() || !slices.Equal(got, OpenACL()) {
			t.Errorf("open cluster, %s: %s", k, FormatACL(got))
		}
	}

	for _, tc := range []struct {
		acl []zk.ACL
		err string
	}{
		{[]zk.ACL{{Perms: zk.PermAll, Scheme: "digest", ID: "admin:x"}}, "hidden digest hashes"},
		{zk.DigestACL(zk.PermRead, "reader", "pw"), "has no admin"},
		{[]zk.ACL{{Perms: zk.PermAll, Scheme: "ip", ID: "10.0.0.1"}}, "neither a digest nor an x509 identity"},
	} {
		if _, err := NewACLRule(tc.acl); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("NewACLRule(%s): %v, want %q", FormatACL(tc.acl), err, tc.err)
		}
	}
}

func TestACLRecordDecoding(t *testing.T) {
	for _, bad := range []string{
		`{"version":1,"reader_records":[]}`,
		`{"version":1,"reader_records":[{"scheme":"digest","id":"admin:x","perms":"rw"}]}`,
		`{"version":1,"reader_records":[{"scheme":"world","id":"anyone","perms":"rz"}]}`,
		`{"version":1,"reader_records":[{"scheme":"world","id":"anyone","perms":""}]}`,
		`{"version":2,"reader_records":[{"scheme":"world","id":"anyone","perms":"r"}]}`,
	} {
		if _, err := DecodeACLRecord("/c/acl", []byte(bad)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", bad, err)
		}
	}
	data, err := aclRecordFor(ClusterACLRule(&testAdmin, &testReader))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := DecodeACLRecord("/c/acl", data)
	if err != nil {
		t.Fatal(err)
	}
	acl, _ := rec.ACL()
	if want, _ := ClusterACLRule(&testAdmin, &testReader).ACL(KindReaderRecord); !slices.Equal(Entries(acl), Entries(want)) {
		t.Errorf("record round trip: %s, want %s", FormatACL(acl), FormatACL(want))
	}
}

// A reader cannot set up what only the admin creates: a supervisor of a
// pool that was never set says what to run, and a cluster made by an
// older shardctl (no ACL record) says to repair it; both work once the
// admin has done so.
func TestIntegrationACLReaderNeedsAdminSetup(t *testing.T) {
	z, ctx, as := adminZK(t)
	rs := zktest.Session(t, zksession.Config{Connect: z.ConnectString, Auth: []zksession.Credential{testReader}})
	p := MustPaths(z.Root, "sec")
	if err := CreateCluster(ctx, as, p, testCluster("sec"), []byte(`{}`), zksession.ClusterACL(&testAdmin, &testReader)); err != nil {
		t.Fatal(err)
	}
	member := PoolMember{Version: PoolMemberVersion, Member: "sv1", State: "starting"}
	_, err := RegisterPoolMember(ctx, rs, p, "web", member)
	if !errors.Is(err, ErrNeedsAdmin) || !strings.Contains(err.Error(), "pool web is not set up") ||
		hint.Of(err) != "create it with `shardctl pool set web --file CONFIG.json` as the cluster's admin" {
		t.Fatalf("member of a pool never set: %v", err)
	}
	err = WritePoolStatus(ctx, rs, p, "web", PoolStatus{Version: PoolStatusVersion, Member: "sv1", Result: SwapOK})
	if !errors.Is(err, ErrNeedsAdmin) || !strings.Contains(hint.Of(err), "shardctl pool set web") {
		t.Fatalf("status of a pool never set: %v", err)
	}
	if ok, _, _ := as.Exists(ctx, p.Pool("web")); ok {
		t.Fatal("the reader created the pool's directory")
	}
	if _, _, err := SetPoolConfig(ctx, as, p, "web", &PoolConfig{Version: PoolConfigVersion, Command: "/bin/app", Workers: 1}, -1); err != nil {
		t.Fatal(err)
	}
	if st, err := ReadPoolStatus(ctx, rs, p, "web"); err != nil || st != nil {
		t.Fatalf("the empty status pool set creates: %+v %v", st, err)
	}
	reg, err := RegisterPoolMember(ctx, rs, p, "web", member)
	if err != nil {
		t.Fatalf("member after pool set: %v", err)
	}
	defer reg.Remove(ctx)
	if err := WritePoolStatus(ctx, rs, p, "web", PoolStatus{Version: PoolStatusVersion, Member: "sv1", Result: SwapOK}); err != nil {
		t.Fatalf("status after pool set: %v", err)
	}
	if _, err := LockGC(ctx, rs, p, nil); !errors.Is(err, zksession.ErrNoAuth) && !errors.Is(err, ErrNeedsAdmin) {
		t.Fatalf("reader taking the GC lock: %v", err)
	}

	// As an older shardctl left it: no ACL record.
	if err := as.Delete(ctx, p.ACLRecord(), zksession.AnyVersion); err != nil {
		t.Fatal(err)
	}
	fresh := zktest.Session(t, zksession.Config{Connect: z.ConnectString, Auth: []zksession.Credential{testReader}})
	if _, err := RegisterRouter(ctx, fresh, p, RouterMember{Version: RouterMemberVersion, ID: "r1"}); !errors.Is(err, ErrNoACLRecord) || !strings.Contains(err.Error(), "older shardctl") || !strings.Contains(hint.Of(err), "shardctl acl repair") {
		t.Fatalf("router on a cluster without ACL record: %v", err)
	}
	rep, err := RepairACLs(ctx, as, p)
	if err != nil || len(rep.Diffs) != 1 || rep.Diffs[0].Path != p.ACLRecord() || rep.Diffs[0].Have != nil {
		t.Fatalf("repair of the missing ACL record: %+v %v", rep, err)
	}
	rr, err := RegisterRouter(ctx, fresh, p, RouterMember{Version: RouterMemberVersion, ID: "r1"})
	if err != nil {
		t.Fatalf("router after repair: %v", err)
	}
	defer rr.Remove(ctx)
	if _, err := CheckACLs(ctx, rs, p); !errors.Is(err, ErrNeedsAdmin) {
		t.Fatalf("acl check as the reader: %v, want ErrNeedsAdmin", err)
	}
}

// acl check finds a znode whose ACL was loosened, a znode an older
// version created open and a wrong ACL record; acl repair fixes them all,
// and the repaired tree passes the attack test's rules again.
func TestIntegrationACLCheckAndRepair(t *testing.T) {
	z, ctx, _ := adminZK(t)
	p, as, _ := securedCluster(t, ctx, z)
	rep, err := CheckACLs(ctx, as, p)
	if err != nil || len(rep.Diffs) != 0 || rep.Open || rep.Checked < 19 {
		t.Fatalf("check of a fresh cluster: %+v %v", rep, err)
	}
	if err := as.SetACL(ctx, p.PoolConfig("web"), OpenACL(), zksession.AnyVersion); err != nil {
		t.Fatal(err)
	}
	if err := as.CreateWithACL(ctx, p.Move("old"), []byte(`{}`), OpenACL()); err != nil {
		t.Fatal(err)
	}
	if _, err := as.Set(ctx, p.ACLRecord(), []byte(`{"version":1,"reader_records":[{"scheme":"world","id":"anyone","perms":"cdrwa"}]}`), zksession.AnyVersion); err != nil {
		t.Fatal(err)
	}
	want := []string{p.PoolConfig("web") + " acl", p.Move("old") + " acl", p.ACLRecord() + " content"}
	diffs := func(rep *ACLReport) []string {
		var out []string
		for _, d := range rep.Diffs {
			out = append(out, d.Path+" "+d.What)
		}
		slices.Sort(out)
		return out
	}
	slices.Sort(want)
	for _, repair := range []bool{false, true} {
		f := CheckACLs
		if repair {
			f = RepairACLs
		}
		rep, err := f(ctx, as, p)
		if err != nil || !slices.Equal(diffs(rep), want) {
			t.Fatalf("repair %v: %v %v, want %v", repair, diffs(rep), err, want)
		}
	}
	for _, d := range []string{p.PoolConfig("web"), p.Move("old")} {
		if acl, _, err := as.GetACL(ctx, d); err != nil || !slices.Equal(Entries(acl), Entries(mustACL(t, ClusterACLRule(&testAdmin, &testReader), KindRecord))) {
			t.Errorf("%s after repair: %s %v", d, FormatACL(acl), err)
		}
	}
	if rep, err := CheckACLs(ctx, as, p); err != nil || len(rep.Diffs) != 0 {
		t.Fatalf("check after repair: %+v %v", rep, err)
	}
}

// With an admin but no reader identity, supervisors and routers run
// anonymously: anyone reads, registers members and writes member records
// and the pool status (the reader's rights), and nothing else.
func TestIntegrationACLWithoutReaderIdentity(t *testing.T) {
	z, ctx, as := adminZK(t)
	anon := zktest.Session(t, zksession.Config{Connect: z.ConnectString})
	p := MustPaths(z.Root, "half")
	if err := CreateCluster(ctx, as, p, testCluster("half"), []byte(`{}`), zksession.ClusterACL(&testAdmin, nil)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := SetPoolConfig(ctx, as, p, "web", &PoolConfig{Version: PoolConfigVersion, Command: "/bin/app", Workers: 1}, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := RegisterPoolMember(ctx, anon, p, "web", PoolMember{Version: PoolMemberVersion, Member: "sv1"}); err != nil {
		t.Fatalf("anonymous supervisor: %v", err)
	}
	if err := WritePoolStatus(ctx, anon, p, "web", PoolStatus{Version: PoolStatusVersion, Member: "sv1", Result: SwapOK}); err != nil {
		t.Fatalf("anonymous status: %v", err)
	}
	if _, err := ReadCluster(ctx, anon, p); err != nil {
		t.Fatalf("anonymous read: %v", err)
	}
	if _, _, err := SetPoolConfig(ctx, anon, p, "web", &PoolConfig{Version: PoolConfigVersion, Command: "/bin/evil", Workers: 1}, -1); !errors.Is(err, zksession.ErrNoAuth) {
		t.Fatalf("anonymous pool set: %v, want ErrNoAuth", err)
	}
	if ms, err := ListPoolMembers(ctx, as, p, "web"); err != nil || len(ms) != 1 || ms[0].Err != nil {
		t.Fatalf("admin reading the anonymous member: %+v %v", ms, err)
	}
	if rep, err := CheckACLs(ctx, as, p); err != nil || len(rep.Diffs) != 0 {
		t.Fatalf("check: %+v %v", rep, err)
	}
}

// The session that re-creates a cluster with other ACLs uses the new rule
// at once (the rule is otherwise read once per session).
func TestIntegrationACLRuleFollowsRecreatedCluster(t *testing.T) {
	z, ctx, as := adminZK(t)
	p := MustPaths(z.Root, "again")
	cfg := &PoolConfig{Version: PoolConfigVersion, Command: "/bin/app", Workers: 1}
	if err := CreateCluster(ctx, as, p, testCluster("again"), []byte(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := SetPoolConfig(ctx, as, p, "web", cfg, -1); err != nil {
		t.Fatal(err)
	}
	if err := DeleteCluster(ctx, as, p); err != nil {
		t.Fatal(err)
	}
	if err := CreateCluster(ctx, as, p, testCluster("again"), []byte(`{}`), zksession.ClusterACL(&testAdmin, &testReader)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := SetPoolConfig(ctx, as, p, "web", cfg, -1); err != nil {
		t.Fatal(err)
	}
	if rep, err := CheckACLs(ctx, as, p); err != nil || len(rep.Diffs) != 0 {
		t.Fatalf("re-created cluster: %+v %v", rep, err)
	}
}

// adminZK gives an ACL test the ensemble, a minute-long context and a
// session as testAdmin.
func adminZK(t *testing.T) (*testenv.ZK, context.Context, *zksession.Session) {
	t.Helper()
	z := testenv.StartZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return z, ctx, zktest.Session(t, zksession.Config{Connect: z.ConnectString, Auth: []zksession.Credential{testAdmin}})
}

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
	buildCluster(t, ctx, p, as, rs, zksession.ClusterACL(&testAdmin, &testReader))
	return p, as, rs
}

// buildCluster creates the cluster at p with acl and one of every kind of
// znode: as writes the admin's, rs the reader's.
func buildCluster(t *testing.T, ctx context.Context, p Paths, as, rs *zksession.Session, acl []zk.ACL) {
	t.Helper()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("create cluster", CreateCluster(ctx, as, p, testCluster(p.ClusterName()), []byte(`{"v":1}`), acl))
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
	// The schema records and lock: a reader or anyone else who could
	// write a change record would have its SQL run on every db node.
	must("schema change record", CreateSchemaChange(ctx, as, p, &SchemaChange{Version: SchemaChangeVersion, ID: "c1", Seq: 1,
		SHA256: strings.Repeat("0", 64), SQL: "SELECT 1", Mode: ModeTransaction, State: SchemaPending}))
	must("schema drift record", WriteSchemaDrift(ctx, as, p, &SchemaDrift{Version: SchemaDriftVersion}))
	must("schema epoch", BumpSchemaEpoch(ctx, as, p))
	_, err = LockSchema(ctx, as, p, []byte("admin pid 1"), nil)
	must("schema lock", err)
}

// rawConn is a plain ZooKeeper connection authenticated as exactly the
// given identities (none: anonymous), as zkCli.sh would be.
func rawConn(t *testing.T, z *testenv.ZK, creds ...zksession.Credential) *zk.Conn {
	t.Helper()
	conn := testenv.RawConn(t, z.Servers, nil)
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
		"locks", "locks/gc", "locks/gc/holder", "locks/rebalance", "locks/schema",
		"schema", "schema/changes", "schema/changes/c1", "schema/drift", "schema/epoch"} {
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
	attempts := attackAll(t, nodes, rel, cleanup, []attacker{{"anonymous", rawConn(t, z)}, {"reader", rawConn(t, z, testReader)}},
		func(who, r, op string) bool { return who == "reader" && (op == "get" || readerWrites[r+" "+op]) })
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

// attacker is a client that tries every operation on every znode.
type attacker struct {
	name string
	conn *zk.Conn
}

// attackAll tries each operation on each of nodes as each attacker and
// fails the test wherever ZooKeeper's verdict is not may's. It returns the
// number of attempts.
func attackAll(t *testing.T, nodes []string, rel func(string) string, cleanup func(string), who []attacker, may func(who, rel, op string) bool) int {
	t.Helper()
	attempts := 0
	for _, a := range who {
		for _, at := range nodes {
			r := rel(at)
			for _, op := range []string{"get", "set", "create", "delete", "setacl"} {
				if r == "" && op == "delete" {
					// The cluster's own znode sits in the shared root, which
					// is open; it cannot be deleted while it has children,
					// and those are protected.
					if err := a.conn.Delete(at, -1); !errors.Is(err, zk.ErrNotEmpty) && !errors.Is(err, zk.ErrNoAuth) {
						t.Errorf("%s deleting the cluster znode: %v", a.name, err)
					}
					continue
				}
				attempts++
				got, err := attempt(a.conn, op, at, cleanup)
				if err != nil {
					t.Errorf("%s %s %s: unexpected error %v", a.name, op, at, err)
					continue
				}
				if want := may(a.name, r, op); got != want {
					verdict := map[bool]string{true: "allowed", false: "refused"}
					t.Errorf("%s %s %s: %s, want %s", a.name, op, at, verdict[got], verdict[want])
				}
			}
		}
	}
	return attempts
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
