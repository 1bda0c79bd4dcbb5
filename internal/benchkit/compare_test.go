package benchkit

import (
	"strings"
	"testing"
)

type cmpMode struct {
	Name string  `json:"mode"`
	P99  float64 `json:"p99"`
}

type cmpSum struct {
	Lat   Stat      `json:"lat"`
	Lost  int       `json:"lost"`
	Modes []cmpMode `json:"modes"`
}

// sumOf is a summary with a latency p99, two modes' p99 and lost writes.
func sumOf(p99, sync, async float64, lost int) *cmpSum {
	return &cmpSum{Lat: Stat{N: 10, P99: p99}, Lost: lost, Modes: []cmpMode{{"sync", sync}, {"async", async}}}
}

func TestComparisonFigures(t *testing.T) {
	c := &Comparison[cmpSum]{Plain: sumOf(10, 4, 2, 0), TLS: sumOf(11, 6, 0, 1)}
	c.Compare([]Figure{{Name: "lat", Path: "lat.p99", Goal: TLSGoal}, {Name: "sync", Path: "modes.sync.p99", Goal: TLSGoal},
		{Name: "by index", Path: "modes.1.p99"}, {Name: "absent", Path: "modes.none.p99"}, {Name: "lost", Path: "lost", Zero: true}})
	if len(c.Pairs) != 3 || len(c.Checks) != 1 {
		t.Fatalf("pairs %+v checks %+v", c.Pairs, c.Checks)
	}
	for i, want := range []struct {
		plain, tls, ratio float64
		met               bool
	}{{10, 11, 1.1, true}, {4, 6, 1.5, false}, {2, 0, 0, true}} {
		p := c.Pairs[i]
		if p.Plain != want.plain || p.TLS != want.tls || p.Ratio == nil || *p.Ratio != want.ratio || p.Met != want.met {
			t.Errorf("%s: %+v, want %+v", p.Name, p, want)
		}
	}
	if k := c.Checks[0]; !k.Plain || k.TLS {
		t.Errorf("lost: %+v, want plain met and TLS not", k)
	}
	if c.Verdict(); c.Met {
		t.Error("met with a ratio over its goal and a check failed")
	}
	ok := &Comparison[cmpSum]{Plain: sumOf(10, 4, 0, 0), TLS: sumOf(10, 4, 0, 0)}
	ok.Compare([]Figure{{Name: "lat", Path: "lat.p99", Goal: TLSGoal}, {Name: "zero", Path: "modes.async.p99", Goal: TLSGoal}, {Name: "lost", Path: "lost", Zero: true}})
	if ok.Verdict(); !ok.Met || ok.Pairs[1].Ratio != nil {
		t.Errorf("equal runs: %+v", ok)
	}
}

func TestComparisonRoundsTakeTheMedian(t *testing.T) {
	c := &Comparison[cmpSum]{Plain: sumOf(10, 4, 2, 0), TLS: sumOf(30, 6, 2, 0), More: []Round[cmpSum]{
		{Plain: sumOf(10, 4, 2, 0), TLS: sumOf(11, 6, 2, 0), TLSFirst: true},
		{Plain: sumOf(10, 4, 2, 0), TLS: sumOf(10, 6, 2, 2)},
	}, Failed: &Round[cmpSum]{Plain: sumOf(1, 4, 2, 0), TLS: sumOf(1000, 6, 2, 9)}}
	c.Compare([]Figure{{Name: "lat", Path: "lat.p99", Goal: TLSGoal}, {Name: "lost", Path: "lost", Zero: true}})
	if len(c.Pairs) != 1 || len(c.Checks) != 1 {
		t.Fatalf("pairs %+v checks %+v", c.Pairs, c.Checks)
	}
	// One round's outlier (3x) does not decide it: the rounds' ratios are
	// 3, 1.1 and 1, their median 1.1; the failed round is in nothing.
	p := c.Pairs[0]
	if p.Plain != 10 || p.TLS != 11 || p.Ratio == nil || *p.Ratio != 1.1 || !p.Met {
		t.Errorf("lat: %+v, want the medians 10 and 11, 1.1x, met", p)
	}
	if len(p.PlainRounds) != 3 || p.TLSRounds[0] != 30 || p.TLSRounds[2] != 10 {
		t.Errorf("lat's rounds: plain %v TLS %v", p.PlainRounds, p.TLSRounds)
	}
	// A check holds only if it holds in every round: the third lost 2.
	if k := c.Checks[0]; !k.Plain || k.TLS {
		t.Errorf("lost: %+v, want plain met and TLS not (its third round lost writes)", k)
	}
	if c.Verdict(); c.Met {
		t.Error("met with a check failed in one round")
	}
	// An even number of rounds: the mean of the middle two; the ratio
	// pairs each round's runs (1 and 0.7), not the medians (12/15).
	even := &Comparison[cmpSum]{Plain: sumOf(10, 4, 2, 0), TLS: sumOf(10, 6, 2, 0), More: []Round[cmpSum]{{Plain: sumOf(20, 4, 2, 0), TLS: sumOf(14, 6, 2, 0)}}}
	even.Compare([]Figure{{Name: "lat", Path: "lat.p99", Goal: TLSGoal}})
	if p := even.Pairs[0]; p.Plain != 15 || p.TLS != 12 || p.Ratio == nil || *p.Ratio != 0.85 || !p.Met {
		t.Errorf("two rounds: %+v, want 15 and 12, 0.85x", p)
	}
	// A round that did not finish fails the verdict.
	short := &Comparison[cmpSum]{Plain: sumOf(10, 4, 2, 0), TLS: sumOf(10, 6, 2, 0), More: []Round[cmpSum]{{Plain: sumOf(10, 4, 2, 0)}}}
	short.Compare([]Figure{{Name: "lat", Path: "lat.p99", Goal: TLSGoal}})
	if short.Verdict(); short.Met {
		t.Error("met with a round's TLS run missing")
	}
}

func TestComparisonReportPrintsTheGoalsRatio(t *testing.T) {
	// Rounds 1 and 0.7: the ratio is their median, 0.85, where TLS/plain of
	// the medians (12/15) is 0.80; the table must print the one the goal
	// was checked on.
	c := &Comparison[cmpSum]{Plain: sumOf(10, 4, 2, 0), TLS: sumOf(10, 6, 2, 0), More: []Round[cmpSum]{{Plain: sumOf(20, 4, 2, 0), TLS: sumOf(14, 6, 2, 0)}}}
	c.Compare([]Figure{{Name: "lat", Path: "lat.p99", Goal: TLSGoal}})
	var b strings.Builder
	c.Report(&Printer{W: &b})
	if !strings.Contains(b.String(), "0.85x") || strings.Contains(b.String(), "0.80x") {
		t.Errorf("report:\n%s\nwant the median of the rounds' ratios, 0.85x, not 0.80x", b.String())
	}
}
