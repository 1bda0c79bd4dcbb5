package main

import (
	"cmp"
	"slices"

	"github.com/shardvisor/shardvisor/internal/benchkit"
)

func report(p *benchkit.Printer, s *Summary) {
	by := map[string]*Mode{}
	for _, m := range s.Modes {
		p.Say("== %s: %d failovers, %d acknowledged writes, %d LOST, %d duplicates (commits whose acknowledgement was lost), %d writes gave up or failed",
			m.Name, len(m.Failovers), m.Acked, m.Lost, m.Duplicates, m.Failed)
		p.Say("   kill -> new leader: p50 %.0f ms, max %.0f ms; kill -> first acknowledged write: p50 %.0f ms, max %.0f ms; election -> first write: p50 %.0f ms, max %.0f ms; ttl %d s: %d kills over ttl + 2 s",
			m.Elected.P50, m.Elected.Max, m.FirstWrite.P50, m.FirstWrite.Max, m.AfterElect.P50, m.AfterElect.Max, m.TTLS, m.Late)
		p.Say("   write p99: before %.1f ms, during %.1f ms, after %.1f ms; steady %.0f writes/s", m.BeforeMS, m.DuringMS, m.AfterMS, m.WritesPerSec)
		for _, e := range topErrors(m.FailedBy, 5) {
			p.Say("   %6d x %s", m.FailedBy[e], e)
		}
		by[m.Name] = m
	}
	if sync, async := by["sync"], by["async"]; sync != nil && async != nil {
		p.Say("async / sync, same run: first write after kill %s, p99 before %s, writes/s %s, lost %d vs %d",
			benchkit.RatioX(async.FirstWrite.P50, sync.FirstWrite.P50), benchkit.RatioX(async.BeforeMS, sync.BeforeMS),
			benchkit.RatioX(async.WritesPerSec, sync.WritesPerSec), async.Lost, sync.Lost)
	}
}

// topErrors are the n commonest errors of by, the commonest first.
func topErrors(by map[string]int64, n int) []string {
	var es []string
	for e := range by {
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b string) int { return cmp.Or(cmp.Compare(by[b], by[a]), cmp.Compare(a, b)) })
	return es[:min(n, len(es))]
}
