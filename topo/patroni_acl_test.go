package topo

import (
	"context"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/zksession"
)

// The walk over Patroni's records lists each znode anyone may write, with
// the ACL it should have, and passes a group locked by set_acls.
func TestCheckPatroniACLs(t *testing.T) {
	_, s := zktest.Memory(t)
	ctx := context.Background()
	patroni := zk.ACL{Perms: zk.PermAll, Scheme: "x509", ID: "CN=pg1,OU=patroni,O=shardvisor"}
	locked := []zk.ACL{patroni, {Perms: zk.PermRead, Scheme: "world", ID: "anyone"}}
	for at, acl := range map[string][]zk.ACL{
		"/service": zk.WorldACL(zk.PermRead), "/service/pg1": locked, "/service/pg1/config": locked, "/service/pg1/leader": locked,
		"/service/pg2": zk.WorldACL(zk.PermAll), "/service/pg2/config": append([]zk.ACL{patroni}, zk.WorldACL(zk.PermRead|zk.PermWrite)...),
	} {
		if err := s.CreateAll(ctx, at); err != nil {
			t.Fatal(err)
		}
		if err := s.SetACL(ctx, at, acl, zksession.AnyVersion); err != nil {
			t.Fatal(err)
		}
	}
	holes, checked, err := CheckPatroniACLs(ctx, s, []string{PatroniDir("/service/", "pg1"), PatroniDir("/service/", "pg3")})
	if err != nil || checked != 4 || len(holes) != 0 {
		t.Fatalf("locked group: %d checked, %+v, %v; want 4 and no hole", checked, holes, err)
	}
	holes, checked, err = CheckPatroniACLs(ctx, s, []string{PatroniDir("/service/", "pg2")})
	if err != nil || checked != 3 || len(holes) != 2 {
		t.Fatalf("open group: %d checked, %+v, %v; want 3 and 2 holes", checked, holes, err)
	}
	if h := holes[0]; h.Path != "/service/pg2" || FormatACL(toACL(t, h.Want)) != "world:anyone:r" {
		t.Errorf("first hole %+v, want /service/pg2 wanting world:anyone:r", h)
	}
	if h := holes[1]; h.Path != "/service/pg2/config" || FormatACL(toACL(t, h.Want)) != "world:anyone:r,x509:CN=pg1,OU=patroni,O=shardvisor:cdrwa" {
		t.Errorf("second hole %+v", h)
	}
}

func toACL(t *testing.T, es []ACLEntry) []zk.ACL {
	t.Helper()
	acl, err := (&ACLRecord{ReaderRecords: es}).ACL()
	if err != nil {
		t.Fatal(err)
	}
	return acl
}
