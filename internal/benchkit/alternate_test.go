package benchkit

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

type altSum struct{ Mode string }

// TestAlternate: rounds alternate which mode runs first, each run's
// summary lands on its mode's side, and a failing run stops the
// comparison with the round and the mode named, its round in Failed.
func TestAlternate(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rounds     int
		otherFirst bool
		failAt     int // the run (1-based) that fails; 0: none
		order      string
		more       int
		failed     bool
	}{
		{name: "one round, baseline first", rounds: 1, order: "direct pooler"},
		{name: "zero rounds run one", rounds: 0, order: "direct pooler"},
		{name: "three rounds alternate", rounds: 3, order: "direct pooler pooler direct direct pooler", more: 2},
		{name: "other first", rounds: 2, otherFirst: true, order: "pooler direct direct pooler", more: 1},
		{name: "a later round fails", rounds: 3, failAt: 4, order: "direct pooler pooler direct", failed: true},
		{name: "the first run fails", rounds: 2, failAt: 1, order: "direct"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ran, reported []string
			c, err := Alternate([2]string{"direct", "pooler"}, tc.rounds, tc.otherFirst, func(string, ...any) {},
				func(other bool) (*altSum, error) {
					m := map[bool]string{false: "direct", true: "pooler"}[other]
					ran = append(ran, m)
					if len(ran) == tc.failAt {
						return &altSum{m}, errors.New("boom")
					}
					return &altSum{m}, nil
				}, func(s *altSum) { reported = append(reported, s.Mode) })
			if got := strings.Join(ran, " "); got != tc.order {
				t.Fatalf("ran %q, want %q", got, tc.order)
			}
			if !slices.Equal(ran, reported) || len(c.LoadAvg) != len(ran) {
				t.Fatalf("reported %v, %d load averages, for runs %v", reported, len(c.LoadAvg), ran)
			}
			if (err != nil) != (tc.failAt > 0) {
				t.Fatalf("err = %v", err)
			}
			if err != nil && !strings.Contains(err.Error(), tc.order[strings.LastIndex(tc.order, " ")+1:]) {
				t.Fatalf("error %q does not name the failing mode", err)
			}
			if c.Plain == nil || c.Plain.Mode != "direct" {
				t.Fatalf("Plain = %+v", c.Plain)
			}
			if tc.failAt != 1 && (c.TLS == nil || c.TLS.Mode != "pooler") {
				t.Fatalf("TLS = %+v", c.TLS)
			}
			if len(c.More) != tc.more || (c.Failed != nil) != tc.failed {
				t.Fatalf("%d more rounds, failed %v; want %d, %v", len(c.More), c.Failed, tc.more, tc.failed)
			}
			for _, r := range c.More {
				if r.Plain.Mode != "direct" || r.TLS.Mode != "pooler" {
					t.Fatalf("round %+v mixes the modes", r)
				}
			}
		})
	}
}

// TestPacerPhases: pacers made together start at spread phases within
// one interval, so that writers started at once do not fire in lockstep.
func TestPacerPhases(t *testing.T) {
	const interval = 64 * time.Millisecond
	before := time.Now()
	phases := map[time.Duration]bool{}
	for range 32 {
		p := NewPacer(interval)
		first := p.next.Add(interval) // Wait's first tick
		if first.Before(before) || first.After(time.Now().Add(interval)) {
			t.Fatalf("first tick %v after the start, want within one interval", first.Sub(before))
		}
		phases[first.Sub(before).Truncate(time.Millisecond)] = true
	}
	if len(phases) < 8 {
		t.Fatalf("32 pacers share %d phases (ms): lockstep", len(phases))
	}
	if p := NewPacer(0); !p.Wait(make(chan struct{})) {
		t.Fatal("an unpaced Pacer did not return at once")
	}
}
