package benchkit

import "testing"

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
