package topo

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

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
		"/sv/c1/pools/web/members/h1":   KindReaderRecord,
		"/sv/c1/pools/web/members/h1/x": KindRecord,
		"/sv/c1/pools/status":           KindRecord,
		"/sv/c1/routers":                KindMemberDir,
		"/sv/c1/routers/r1":             KindReaderRecord,
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
		{[]zk.ACL{{Perms: zk.PermAll, Scheme: "ip", ID: "10.0.0.1"}}, "not a digest identity"},
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
	z := testenv.StartZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	as := zktest.Session(t, zksession.Config{Connect: z.ConnectString, Auth: []zksession.Credential{testAdmin}})
	rs := zktest.Session(t, zksession.Config{Connect: z.ConnectString, Auth: []zksession.Credential{testReader}})
	p := MustPaths(z.Root, "sec")
	if err := CreateCluster(ctx, as, p, testCluster("sec"), []byte(`{}`), zksession.ClusterACL(&testAdmin, &testReader)); err != nil {
		t.Fatal(err)
	}
	member := PoolMember{Version: PoolMemberVersion, Member: "sv1", State: "starting"}
	_, err := RegisterPoolMember(ctx, rs, p, "web", member)
	if !errors.Is(err, ErrNeedsAdmin) || !strings.Contains(err.Error(), "create it with `shardctl pool set web --file CONFIG.json`") {
		t.Fatalf("member of a pool never set: %v", err)
	}
	err = WritePoolStatus(ctx, rs, p, "web", PoolStatus{Version: PoolStatusVersion, Member: "sv1", Result: SwapOK})
	if !errors.Is(err, ErrNeedsAdmin) || !strings.Contains(err.Error(), "shardctl pool set web") {
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
	if _, err := RegisterRouter(ctx, fresh, p, RouterMember{Version: RouterMemberVersion, ID: "r1"}); !errors.Is(err, ErrNoACLRecord) || !strings.Contains(err.Error(), "shardctl acl repair") {
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
	z := testenv.StartZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
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
	z := testenv.StartZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	as := zktest.Session(t, zksession.Config{Connect: z.ConnectString, Auth: []zksession.Credential{testAdmin}})
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
	z := testenv.StartZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	as := zktest.Session(t, zksession.Config{Connect: z.ConnectString, Auth: []zksession.Credential{testAdmin}})
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
