package bucketmap

import (
	"strings"
	"testing"
)

const groupDSN = "postgres://app@10.0.0.1:5432,10.0.0.2:5433/app?target_session_attrs=read-write&connect_timeout=2"

func TestValidateGroupNodes(t *testing.T) {
	good := node("g1", 1)
	good.DSN = groupDSN
	good.Patroni = Patroni{Namespace: DefaultPatroniNamespace, Scope: "pg-g1"}
	if err := ValidateNode(good); err != nil {
		t.Fatal(err)
	}
	if got := DSNHosts(good.DSN); strings.Join(got, " ") != "10.0.0.1:5432 10.0.0.2:5433" {
		t.Fatalf("DSNHosts = %q", got)
	}
	wantInvalidNodes(t, good, []badNode{
		{func(n *Node) { n.DSN = "postgres://app@h1:5432,h2:5432/app" }, "target_session_attrs=read-write"},
		{func(n *Node) { n.DSN = "postgres://app@h1,h2/app?target_session_attrs=any" }, `target_session_attrs is "any"`},
		{func(n *Node) { n.DSN = "postgres://app@h1:5432,:5433/app?target_session_attrs=read-write" }, "empty host"},
		{func(n *Node) { n.DSN = "postgres://app@h1:99999,h2:1/app?target_session_attrs=read-write" }, "not 1..65535"},
		{func(n *Node) { n.DSN = "postgres://app:hunter2@h1:1,h2:2/app?target_session_attrs=read-write" }, "contains a password"},
		{func(n *Node) { n.Patroni.Scope = "a/b" }, "patroni scope"},
		{func(n *Node) { n.Patroni.Scope = "" }, "patroni scope"},
		{func(n *Node) { n.Patroni.Namespace = "service" }, "patroni namespace"},
		{func(n *Node) { n.Patroni.Namespace = "/service" }, "patroni namespace"},
		{func(n *Node) { n.Patroni.Namespace = "/a/../b/" }, "patroni namespace"},
		{func(n *Node) { n.DSN = "postgres://app@h1:5432/app" }, "must set target_session_attrs=read-write"},
		{func(n *Node) { n.DSN = "postgres://app@h1/app?host=h1,h2&target_session_attrs=read-write" }, "has a host parameter"},
		{func(n *Node) { n.DSN = "postgres://app@h1/app?port=1,2&target_session_attrs=read-write" }, "has a port parameter"},
	})
	// One host needs no attribute: a plain node, as before.
	plain := node("p1", 1)
	plain.DSN = "postgres://app@h1/app"
	if err := ValidateNode(plain); err != nil {
		t.Fatal(err)
	}
}

// A group's reference survives the record, and a map without groups
// encodes exactly as before (no "patroni" key), so older readers keep
// reading it.
func TestGroupRecordRoundTrip(t *testing.T) {
	ns := nodes(2)
	plain, err := Encode(mustNew(t, 2, ns))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(plain), "patroni") {
		t.Fatalf("a map without groups mentions patroni: %s", plain)
	}
	ns[1].DSN = groupDSN
	ns[1].Patroni = Patroni{Namespace: "/service/", Scope: "pg2"}
	data, err := Encode(mustNew(t, 2, ns))
	if err != nil {
		t.Fatal(err)
	}
	back, err := Decode("/m", data)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := back.Node("n2")
	if n.Patroni != ns[1].Patroni || n.DSN != groupDSN {
		t.Fatalf("decoded %+v", n)
	}
	if n, _ := back.Node("n1"); !n.Patroni.IsZero() {
		t.Fatalf("n1 became a group: %+v", n)
	}
	// A hand-edited record with a bad scope is refused, naming it.
	bad := strings.Replace(string(data), `"scope":"pg2"`, `"scope":"../x"`, 1)
	if _, err := Decode("/m", []byte(bad)); err == nil || !strings.Contains(err.Error(), "patroni scope") {
		t.Fatalf("bad scope decoded: %v", err)
	}
}
