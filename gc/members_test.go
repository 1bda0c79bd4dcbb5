package gc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
)

// A live member still routing by a map from before a range changed owner
// (a straggler a move went on without) keeps GC off that range, as does a
// member record that cannot be read, and, for one session timeout, a
// record a run saw that has vanished since; once it catches up, GC
// deletes.
func TestIntegrationGCWaitsForStragglers(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2, 2)
	r := rand.New(rand.NewPCG(7, 8))
	m := c.filled(r, 20)
	before := m.Version
	from := m.Owner(0)
	to := c.ids[0]
	if to == from {
		to = c.ids[1]
	}
	m = c.move(m, 0, to)
	flip := m.HistoryOf(0)[0].UntilVersion
	ctx := context.Background()
	ms := c.session() // the members' processes
	p := c.st.Paths()
	straggler, err := topo.RegisterPoolMember(ctx, ms, p, "web", topo.PoolMember{Version: topo.PoolMemberVersion, Member: "slow", MapVersion: before})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topo.RegisterRouter(ctx, ms, p, topo.RouterMember{Version: topo.RouterMemberVersion, ID: "current", MapVersion: flip}); err != nil {
		t.Fatal(err)
	}

	skippedFor := func(rep *Report, has string) {
		t.Helper()
		if rep.Deleted != 0 || len(rep.Work) != 0 || len(rep.Skipped) != 1 {
			t.Fatalf("report %+v", rep)
		}
		s := rep.Skipped[0]
		if s.Kind != SkipMemberBehind || !s.Uncertain || s.Lo != 0 || !strings.Contains(s.Reason, has) {
			t.Fatalf("skipped %s (uncertain %v): %s; want %s naming %q", s.Kind, s.Uncertain, s.Reason, SkipMemberBehind, has)
		}
		if n := c.counts(from, m.Level)[0]; n != 20 {
			t.Fatalf("%d of bucket 0's 20 leftover rows left on %s", n, from)
		}
	}
	skippedFor(c.run(Options{Grace: -1}), fmt.Sprintf("%s (at map version %d)", p.PoolMember("web", "slow"), before))

	bad := p.Router("garbled")
	garbled, err := ms.CreateEphemeral(ctx, bad, []byte("{"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := straggler.Update(ctx, topo.PoolMember{Version: topo.PoolMemberVersion, Member: "slow", MapVersion: flip}); err != nil {
		t.Fatal(err)
	}
	// One GC from here on, which remembers what its runs saw, on a clock
	// of its own.
	now := time.Now()
	g := c.gc(Options{Grace: -1, Now: func() time.Time { return now }})
	run := func() *Report {
		t.Helper()
		rep, err := g.Run(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	skippedFor(run(), bad+" (record unreadable")

	// Its process removes it (a raw delete would be undone: an ephemeral
	// is re-created when deleted under its live session). It vanished
	// after a run saw it: for one session timeout it counts, at no
	// version; nothing is deleted, and nothing is uncertain.
	if err := garbled.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	rep := run()
	if rep.Deleted != 0 || len(rep.Skipped) != 1 || rep.Skipped[0].Kind != SkipMemberVanished || rep.Skipped[0].Uncertain ||
		!strings.Contains(rep.Skipped[0].Reason, bad+" (at map version 0, record vanished") || rep.Uncertain() != 0 {
		t.Fatalf("right after the garbled record vanished: deleted %d, skipped %+v", rep.Deleted, rep.Skipped)
	}
	now = now.Add(g.Session.SessionTimeout())
	rep = run()
	if len(rep.Skipped) != 0 || rep.Deleted != 20 || c.counts(from, m.Level)[0] != 0 {
		t.Fatalf("after the members caught up: deleted %d, skipped %+v", rep.Deleted, rep.Skipped)
	}
}

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
		data, err := topo.Encode(rec)
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
