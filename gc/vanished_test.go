package gc

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
)

// GC remembers the member records its earlier runs saw: one deleted by
// another session since counts at its last version (its range is skipped,
// member-vanished, not uncertain) until it reappears (then at its new
// version) or one session timeout has passed since a run found it gone. A
// GC with no earlier run cannot know, and counts what it reads. The clock
// is GC's own (Options.Now), moved by hand.
func TestVanishedMembersRemembered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	z, s := zktest.NewMemoryTree(t)
	owner, other := z.Session(t), z.Session(t)
	p := topo.MustPaths(z.Root, "c1")
	for _, dir := range []string{p.Routers(), p.Pools()} {
		if err := s.CreateAll(ctx, dir); err != nil {
			t.Fatal(err)
		}
	}
	// Plain nodes, which nobody re-creates (an owner's ephemeral would be).
	put := func(at string, rec any) {
		data, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		zktest.Put(t, owner, at, string(data))
	}
	router := func(v uint64) topo.RouterMember {
		return topo.RouterMember{Version: topo.RouterMemberVersion, ID: "r1", MapVersion: v}
	}
	r1, h1 := p.Router("r1"), p.PoolMember("web", "h1")
	put(r1, router(5))
	put(h1, topo.PoolMember{Version: topo.PoolMemberVersion, Member: "h1", State: "serving", MapVersion: 6})

	// n1 owned bucket 0 until map version 6.
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m, err := bucketmap.New(1, []bucketmap.Node{{ID: "n1", DSN: "postgres://a@h1/db"}, {ID: "n2", DSN: "postgres://a@h2/db"}}, t0)
	if err != nil {
		t.Fatal(err)
	}
	m.Version = 6
	b0 := bucketmap.Bucket{Prefix: 0, Depth: 1}
	to := bucketmap.NodeID("n2")
	if m.OwnerOf(b0) == to {
		to = "n1"
	}
	if err := m.Assign(b0, to, bucketmap.AssignOptions{}); err != nil {
		t.Fatal(err)
	}

	now := t0.Add(time.Hour)
	newGC := func() *GC {
		return &GC{Session: s, Store: bucketmap.NewStore(s, p), Opt: Options{Now: func() time.Time { return now }}}
	}
	g := newGC()
	grace := s.SessionTimeout()
	// pass reads the members as a run does and says how bucket 0 fares.
	pass := func(g *GC) (skip *Skip) {
		t.Helper()
		members, err := g.readMembers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g.segments = map[string]int{}
		rep := &Report{}
		cands := g.candidates(m, nil, members, rep)
		if len(cands)+len(rep.Skipped) != 1 {
			t.Fatalf("bucket 0: %d ranges, %+v skipped", len(cands), rep.Skipped)
		}
		if len(rep.Skipped) == 1 {
			return &rep.Skipped[0]
		}
		return nil
	}
	skippedFor := func(sk *Skip, kind, has string) {
		t.Helper()
		if sk == nil || sk.Kind != kind || sk.Uncertain != (kind == SkipMemberBehind) || !strings.Contains(sk.Reason, has) {
			t.Fatalf("bucket 0: skipped %+v; want %s naming %q", sk, kind, has)
		}
	}
	if sk := pass(g); sk == nil || sk.Kind != SkipMemberBehind || !strings.Contains(sk.Reason, r1+" (at map version 5)") {
		t.Fatalf("r1 behind at 5: %+v", sk)
	}

	// Another session deletes r1: the next run counts it, at 5.
	if err := other.Delete(ctx, r1, -1); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Minute)
	skippedFor(pass(g), SkipMemberVanished, r1+" (at map version 5, record vanished 0s ago (last seen 1m0s ago); counted until its session is shown ended (at most "+grace.String()+"))")
	// A GC that never ran before cannot know r1 was there.
	if sk := pass(newGC()); sk != nil {
		t.Fatalf("a first run counts only what it reads: %+v", sk)
	}
	// Still within the grace; then r1 is back, at 6: it counts at 6.
	now = now.Add(grace / 2)
	skippedFor(pass(g), SkipMemberVanished, "record vanished "+(grace/2).String()+" ago")
	put(r1, router(6))
	now = now.Add(time.Second)
	if sk := pass(g); sk != nil {
		t.Fatalf("r1 back at 6: %+v", sk)
	}
	// Gone at 6, it holds nothing back from a range taken at 6.
	if err := other.Delete(ctx, r1, -1); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	if sk := pass(g); sk != nil {
		t.Fatalf("r1 gone at 6: %+v", sk)
	}

	// A member gone behind while another live one is behind too: the live
	// one makes it member-behind, uncertain.
	put(r1, router(5))
	now = now.Add(time.Second)
	pass(g)
	if err := other.Delete(ctx, r1, -1); err != nil {
		t.Fatal(err)
	}
	put(p.Router("r2"), topo.RouterMember{Version: topo.RouterMemberVersion, ID: "r2", MapVersion: 4})
	now = now.Add(time.Second)
	skippedFor(pass(g), SkipMemberBehind, "2 members have not applied map version 6")
	if err := other.Delete(ctx, p.Router("r2"), -1); err != nil {
		t.Fatal(err)
	}
	// r2 was seen at 4 and is gone too; once the grace has passed since
	// each was found gone, both are forgotten and GC may go on.
	now = now.Add(time.Second)
	skippedFor(pass(g), SkipMemberVanished, "2 members have not applied map version 6")
	now = now.Add(grace)
	if sk := pass(g); sk != nil {
		t.Fatalf("after the grace: %+v", sk)
	}
}
