package bucketmap

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A restore gives the map the earlier map's buckets and owners, every
// bucket active, under the node registry of now (a moved DSN is kept).
func TestRestoreOwnership(t *testing.T) {
	nodes := []Node{{ID: "a", DSN: "postgres://old-a/app"}, {ID: "b", DSN: "postgres://old-b/app"}}
	then, err := New(2, nodes, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	b := Bucket{Prefix: 1, Depth: 2}
	if err := then.SetMoving(b, "b", "m1"); err != nil {
		t.Fatal(err)
	}
	now := then.Clone()
	now.Version = 9
	if err := now.SplitBucket(Bucket{Prefix: 3, Depth: 2}); err != nil {
		t.Fatal(err)
	}
	if err := now.Assign(Bucket{Prefix: 0, Depth: 2}, "b", AssignOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	now.nodes[0].DSN = "postgres://new-a/app"
	if err := now.RestoreOwnership(then); err != nil {
		t.Fatal(err)
	}
	if now.Version != 9 || now.Level != 2 || now.Buckets() != 4 || !now.Uniform() {
		t.Fatalf("restored: version %d level %d buckets %d uniform %v", now.Version, now.Level, now.Buckets(), now.Uniform())
	}
	for _, bk := range then.BucketList() {
		if now.OwnerOf(bk) != then.OwnerOf(bk) {
			t.Errorf("bucket %s: owner %s, want %s", bk, now.OwnerOf(bk), then.OwnerOf(bk))
		}
	}
	if st := now.MetaOf(b).State; st != BucketActive && st != "" {
		t.Fatalf("bucket moving at the point is %q, want active", st)
	}
	if n, _ := now.Node("a"); n.DSN != "postgres://new-a/app" {
		t.Fatalf("node a's DSN %s, want today's", n.DSN)
	}
	if err := now.Validate(); err != nil {
		t.Fatal(err)
	}
	// A node that owned buckets at the point and is down now is refused.
	down := then.Clone()
	down.nodes[1].State = NodeDown
	if err := down.RestoreOwnership(then); err == nil || !strings.Contains(err.Error(), "node up b") {
		t.Fatalf("restore onto a down owner: %v", err)
	}
	// A node the point's map names must still be registered.
	lone, _ := New(2, nodes[:1], time.Unix(0, 0))
	if err := lone.RestoreOwnership(then); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("restore without node b: %v, want ErrUnknownNode", err)
	}
}
