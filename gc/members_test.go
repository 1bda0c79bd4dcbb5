package gc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

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
