package gc

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/zktest"
)

// GC leaves a range alone while its owner (or the node holding the
// leftovers) is a Patroni group that is not whole: no leader, or no
// synchronous standby. The copy it would delete may be the only one left
// after the group's next failover.
func TestGroupsNotWholeKeepTheirLeftovers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, s := zktest.NewMemoryTree(t)
	set := func(p, v string) { zktest.Put(t, s, p, v) }
	set("/service/g1/initialize", "1")
	set("/service/g1/config", `{"ttl":10,"synchronous_mode":true,"ignore_slots":[{"type":"logical"}]}`)
	set("/service/g1/members/g1-a", `{"role":"master","state":"running","timeline":1}`)
	set("/service/g1/members/g1-b", `{"role":"replica","state":"running","timeline":1}`)
	set("/service/g1/leader", "g1-a")
	set("/service/g1/sync", `{"leader":"g1-a","sync_standby":"g1-b"}`)

	nodes := []bucketmap.Node{
		{ID: "p1", DSN: "postgres://a@h1/db", Weight: 1, State: bucketmap.NodeActive},
		{ID: "g1", DSN: "postgres://a@h2:1,h3:1/db?target_session_attrs=read-write", Weight: 1, State: bucketmap.NodeActive,
			Patroni: bucketmap.Patroni{Namespace: "/service/", Scope: "g1"}},
	}
	m, err := bucketmap.New(1, nodes, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	g := &GC{Session: s}
	cands := []Range{{Node: "p1", Owner: "g1", Level: 1, Lo: 0, Hi: 0}, {Node: "g1", Owner: "p1", Level: 1, Lo: 1, Hi: 1}}
	rep := &Report{}
	if kept := g.checkGroups(ctx, m, cands, rep); len(kept) != 2 || len(rep.Skipped) != 0 {
		t.Fatalf("a whole group: kept %d, skipped %+v", len(kept), rep.Skipped)
	}
	for _, tc := range []struct {
		change func()
		want   string
	}{
		{func() {
			set("/service/g1/config", `{"ttl":10,"synchronous_mode":false}`)
		}, "not in synchronous mode"},
		{func() {
			set("/service/g1/config", `{"ttl":10,"synchronous_mode":true}`)
			set("/service/g1/sync", `{"leader":"g1-a","sync_standby":null}`)
		}, "no synchronous standby"},
		{func() {
			if err := s.Delete(ctx, "/service/g1/leader", -1); err != nil {
				t.Fatal(err)
			}
		}, "no leader"},
	} {
		tc.change()
		rep := &Report{}
		kept := g.checkGroups(ctx, m, cands, rep)
		if len(kept) != 0 || len(rep.Skipped) != 2 {
			t.Fatalf("%s: kept %d, skipped %+v", tc.want, len(kept), rep.Skipped)
		}
		for _, sk := range rep.Skipped {
			if sk.Kind != SkipGroup || !strings.Contains(sk.Reason, "g1 is a Patroni group") || !strings.Contains(sk.Reason, tc.want) || !sk.Uncertain {
				t.Fatalf("skip %+v, want %q", sk, tc.want)
			}
		}
	}
	// Records that cannot be read count as a group not whole.
	if err := s.DeleteAll(ctx, "/service/g1"); err != nil {
		t.Fatal(err)
	}
	rep = &Report{}
	if kept := g.checkGroups(ctx, m, cands, rep); len(kept) != 0 || len(rep.Skipped) != 2 || !strings.Contains(rep.Skipped[0].Reason, "cannot be read") {
		t.Fatalf("unreadable records: kept %d, skipped %+v", len(kept), rep.Skipped)
	}
}
