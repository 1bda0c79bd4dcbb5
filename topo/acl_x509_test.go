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

const testAdminDN = "CN=operator,OU=admin,O=shardvisor"

// The rule of a cluster whose admin is an x509 identity: member records
// name their creator, nobody but the admin deletes in a member directory,
// readers need no ACL record.
func TestACLRuleX509(t *testing.T) {
	r, err := NewACLRule(zksession.X509ClusterACL(testAdminDN))
	if err != nil {
		t.Fatal(err)
	}
	if !r.X509() || r.Open() {
		t.Fatalf("x509 %v open %v, want an x509 rule", r.X509(), r.Open())
	}
	admin := zk.ACL{Perms: zk.PermAll, Scheme: "x509", ID: testAdminDN}
	for k, want := range map[NodeKind][]zk.ACL{
		KindRecord:       {admin, {Perms: zk.PermRead, Scheme: "world", ID: "anyone"}},
		KindMemberDir:    {admin, {Perms: zk.PermRead | zk.PermCreate, Scheme: "world", ID: "anyone"}},
		KindReaderRecord: {admin, {Perms: zk.PermRead | zk.PermWrite, Scheme: "world", ID: "anyone"}},
	} {
		if got := mustACL(t, r, k); !slices.Equal(got, want) {
			t.Errorf("%s: %s, want %s", k, FormatACL(got), FormatACL(want))
		}
	}
	const web1 = "CN=web1,OU=webhead,O=shardvisor"
	got, err := r.MemberRecordACL(web1)
	want := []zk.ACL{{Perms: zk.PermRead | zk.PermWrite, Scheme: "x509", ID: web1}, admin, {Perms: zk.PermRead, Scheme: "world", ID: "anyone"}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("member record of web1: %s (%v), want %s", FormatACL(got), err, FormatACL(want))
	}
	if r.memberCreator(got) != web1 {
		t.Errorf("creator of %s: %q, want web1's", FormatACL(got), r.memberCreator(got))
	}
	// The admin's own record: no separate creator entry.
	if got, _ := r.MemberRecordACL(testAdminDN); len(got) != 2 {
		t.Errorf("member record of the admin: %s, want the admin and readers only", FormatACL(got))
	}
	if _, err := r.MemberRecordACL(""); !errors.Is(err, ErrNoIdentity) {
		t.Errorf("member record without an identity: %v, want ErrNoIdentity", err)
	}
	// Digest clusters keep one shared reader identity: the member record
	// is the reader record, whoever creates it.
	d := ClusterACLRule(&testAdmin, &testReader)
	if got, _ := d.MemberRecordACL(web1); !slices.Equal(got, mustACL(t, d, KindReaderRecord)) {
		t.Errorf("digest member record: %s", FormatACL(got))
	}
	mixed := append(zksession.X509ClusterACL(testAdminDN), zksession.ClusterACL(&testAdmin, nil)[0])
	if _, err := NewACLRule(mixed); err == nil || !strings.Contains(err.Error(), "mixes digest and x509") {
		t.Errorf("mixed admins: %v", err)
	}
}

// A cluster with x509 ACLs on a TLS-only ensemble, attacked by another web
// head and by a db host's Patroni identity: neither changes or deletes a
// record it did not make, nor deletes its own; a name taken by another
// identity is reported with that identity; a member record with a
// foreign ACL is a hole `acl check` finds and `acl repair` removes; the
// walk finds no hole in the cluster the processes built.
func TestIntegrationACLX509(t *testing.T) {
	z := testenv.StartTLSZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adminF, web1F, web2F := z.Identity(t, "admin", "operator"), z.Identity(t, "webhead", "web1"), z.Identity(t, "webhead", "web2")
	as := zktest.Session(t, zktest.TLSConfig(t, z.ConnectString, adminF))
	w1 := zktest.Session(t, zktest.TLSConfig(t, z.ConnectString, web1F))
	w2 := zktest.Session(t, zktest.TLSConfig(t, z.ConnectString, web2F))
	if as.Identity() != testAdminDN {
		t.Fatalf("the admin's identity %q, want %q", as.Identity(), testAdminDN)
	}
	p := MustPaths("/sv", "x509")
	buildCluster(t, ctx, p, as, w1, zksession.X509ClusterACL(as.Identity()))
	if _, err := RegisterRouter(ctx, w2, p, RouterMember{Version: RouterMemberVersion, ID: "r2", MapVersion: 1}); err != nil {
		t.Fatalf("web2 registers its router: %v", err)
	}
	if r, err := ReadACLRule(ctx, w1, p); err != nil || !r.X509() || r.readerView {
		t.Fatalf("web1's rule: %+v, %v; want the x509 rule, derived without the admin", r, err)
	}
	rep, err := CheckACLs(ctx, as, p)
	if err != nil || len(rep.Diffs) != 0 {
		t.Fatalf("acl check of the cluster as built: %+v, %v; want no hole", rep, err)
	}

	nodes := tree(t, ctx, as, p.Cluster())
	rel := func(at string) string { return strings.TrimPrefix(strings.TrimPrefix(at, p.Cluster()), "/") }
	admin := z.Conn(t, adminF)
	cleanup := func(at string) {
		if err := admin.Delete(at, -1); err != nil {
			t.Errorf("cleanup of %s: %v", at, err)
		}
	}
	// What any host with a certificate may do (ZooKeeper cannot tell a
	// web head's certificate from a db host's without listing every host
	// in the ACLs): make its own member record, write the pool status.
	// Nobody changes a record another made; nobody but the admin deletes
	// anything.
	webWrites := map[string]bool{"routers create": true, "pools/web/members create": true, "pools/web/status set": true}
	own := map[string]string{"routers/r1": "web1", "pools/web/members/sv1": "web1", "routers/r2": "web2"}
	attempts := attackAll(t, nodes, rel, cleanup, []attacker{{"web2", z.Conn(t, web2F)}, {"pg1", z.Conn(t, z.Identity(t, "patroni", "pg1"))}},
		func(who, r, op string) bool {
			return op == "get" || webWrites[r+" "+op] || op == "set" && own[r] == who
		})
	t.Logf("%d attempts on %d znodes as another web head and as a db host", attempts, len(nodes))

	// A name taken by another identity: reported with that identity, not
	// taken for this host's own previous run.
	if _, err := RegisterPoolMember(ctx, w2, p, "web", PoolMember{Version: PoolMemberVersion, Member: "sv9", Host: "web1", State: "serving"}); err != nil {
		t.Fatalf("web2 takes the name sv9: %v", err)
	}
	_, err = RegisterPoolMember(ctx, w1, p, "web", PoolMember{Version: PoolMemberVersion, Member: "sv9", State: "starting"})
	if !errors.Is(err, zksession.ErrOwnedElsewhere) || !strings.Contains(err.Error(), "CN=web2,OU=webhead") {
		t.Errorf("web1 registering sv9 held by web2: %v; want ErrOwnedElsewhere naming web2's identity", err)
	}
	h, err := ReadPoolMemberHolder(ctx, w1, p, "web", "sv9")
	if err != nil || h.Creator != w2.Identity() || h.Rec.Host != "web1" {
		t.Errorf("holder of sv9: %+v, %v; want created by web2 whatever the record says", h, err)
	}

	// The owner cannot delete its record either: Remove leaves it to the
	// session's end, which removes it.
	w3 := zktest.Session(t, zktest.TLSConfig(t, z.ConnectString, z.Identity(t, "webhead", "web3")))
	reg, err := RegisterRouter(ctx, w3, p, RouterMember{Version: RouterMemberVersion, ID: "r3", MapVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Remove(ctx); err != nil {
		t.Errorf("web3 removes its record: %v", err)
	}
	if ok, _, _ := as.Exists(ctx, p.Router("r3")); !ok {
		t.Errorf("r3 gone after Remove: its owner may not delete in routers/")
	}
	w3.Close()
	testenv.WaitFor(t, 20*time.Second, func() bool { ok, _, _ := as.Exists(ctx, p.Router("r3")); return !ok }, "r3 gone with web3's session")

	// A session without a certificate identity cannot make a member
	// record whose ACL names its creator.
	anon := zktest.TLSConfig(t, z.ConnectString, web1F)
	anon.Identity = ""
	if _, err := RegisterRouter(ctx, zktest.Session(t, anon), p, RouterMember{Version: RouterMemberVersion, ID: "r4"}); !errors.Is(err, ErrNoIdentity) {
		t.Errorf("member record without an identity: %v, want ErrNoIdentity", err)
	}

	// A record made with an ACL of its own choosing is a hole: found,
	// and removed by repair.
	evil := p.Router("evil")
	if _, err := z.Conn(t, web2F).Create(evil, []byte("{}"), zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("web2 creates a world-writable record: %v", err)
	}
	rep, err = CheckACLs(ctx, as, p)
	if err != nil || len(rep.Diffs) != 1 || rep.Diffs[0].Path != evil || rep.Diffs[0].Kind != "member-record" {
		t.Fatalf("acl check with a world-writable member record: %+v, %v; want exactly that record", rep, err)
	}
	if _, err := RepairACLs(ctx, as, p); err != nil {
		t.Fatal(err)
	}
	if rep, err := CheckACLs(ctx, as, p); err != nil || len(rep.Diffs) != 0 {
		t.Errorf("acl check after repair: %+v, %v", rep, err)
	}
	if ok, _, _ := as.Exists(ctx, evil); ok {
		t.Errorf("repair left %s", evil)
	}
}
