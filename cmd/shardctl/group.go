package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// readGroups reads the group of every node that is one (not removed).
// A group that cannot be read is reported, not fatal: status must show
// the map whatever Patroni's records say.
func readGroups(ctx context.Context, s *zksession.Session, m *bucketmap.Map) map[bucketmap.NodeID]*topo.PatroniView {
	out := map[bucketmap.NodeID]*topo.PatroniView{}
	for _, n := range m.Nodes() {
		if n.Patroni.IsZero() || n.State == bucketmap.NodeRemoved {
			continue
		}
		out[n.ID] = readGroup(ctx, s, n)
	}
	return out
}

func readGroup(ctx context.Context, s *zksession.Session, n bucketmap.Node) *topo.PatroniView {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return topo.ReadPatroniView(rctx, s, n.Patroni.Namespace, n.Patroni.Scope)
}

// clean drops control characters: Patroni's records are writable by
// anyone who reaches the ensemble (docs/failover.md, Security), and a
// terminal must not take their text for escape sequences.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, s)
}

// writeGroup prints one group for people: its primary, each member with
// role, state, timeline and lag, and its problems.
func writeGroup(w io.Writer, id bucketmap.NodeID, g *topo.PatroniView) {
	fmt.Fprintf(w, "node %s is Patroni group %s (%s%s)", id, g.Scope, g.Namespace, g.Scope)
	if g.Error != "" {
		fmt.Fprintf(w, ": UNREADABLE: %s\n", clean(g.Error))
		return
	}
	if p, ok := g.Primary(); ok {
		fmt.Fprintf(w, ": primary %s, timeline %d\n", clean(p.Name), p.Timeline)
	} else {
		fmt.Fprintf(w, ": NO PRIMARY\n")
	}
	for _, m := range g.Members {
		lag := "lag ?"
		if m.LagBytes >= 0 {
			lag = fmt.Sprintf("lag %d B", m.LagBytes)
		}
		extra := ""
		if m.Sync {
			extra = "  sync"
		}
		if m.Error != "" {
			fmt.Fprintf(w, "  %-20s %s\n", clean(m.Name), clean(m.Error))
			continue
		}
		fmt.Fprintf(w, "  %-20s %-8s %-10s tl %-3d %-10s %s%s\n", clean(m.Name), clean(m.Role), clean(m.State), m.Timeline, lag, clean(m.ConnURL), extra)
	}
	for _, p := range g.Problems {
		sev := "warning"
		if p.Severe {
			sev = "PROBLEM"
		}
		fmt.Fprintf(w, "  %s: %s\n", sev, clean(p.Message))
	}
}
