package benchkit

import (
	"fmt"
	"os"
)

// Alternate runs a two-mode comparison on one environment (issue 42's
// direct against pooler): rounds (at least 1) of run(false), the
// baseline, and run(true), the other mode, alternating which goes first;
// otherFirst makes the first round start with the other mode. After each
// run it calls report with the run's summary (when it has one) and
// records the machine's load. A run's error stops the comparison: a first
// round's is in the result's Plain/TLS as far as it got, a later one's in
// Failed, and the error names the round and the mode. The caller adds
// the figures (Compare) and the verdict.
func Alternate[S any](modes [2]string, rounds int, otherFirst bool, say func(string, ...any),
	run func(other bool) (*S, error), report func(*S)) (*Comparison[S], error) {
	c := &Comparison[S]{Modes: modes[:]}
	for i := range max(rounds, 1) {
		r := Round[S]{TLSFirst: otherFirst != (i%2 == 1)}
		var err error
		for _, other := range []bool{r.TLSFirst, !r.TLSFirst} {
			mode := modes[0]
			if other {
				mode = modes[1]
			}
			say("\n== round %d: %s", i+1, mode)
			var s *S
			s, err = run(other)
			if s != nil {
				report(s)
			}
			c.LoadAvg = append(c.LoadAvg, mode+" "+LoadAvg(3))
			if other {
				r.TLS = s
			} else {
				r.Plain = s
			}
			if err != nil {
				err = fmt.Errorf("round %d, %s: %w", i+1, mode, err)
				break
			}
		}
		switch {
		case i == 0:
			c.Plain, c.TLS, c.TLSFirst = r.Plain, r.TLS, r.TLSFirst
		case err != nil:
			c.Failed = &r
		default:
			c.More = append(c.More, r)
		}
		if err != nil {
			return c, err
		}
	}
	return c, nil
}

// Conclude ends a comparison's program: it adds figs (Compare), prints
// the report (and the JSON with jsonOut) through Finish, which exits 1
// on err, and exits 1 too when a check failed in any run (an
// acknowledged write lost, say), so that a script sees it.
func (c *Comparison[S]) Conclude(name string, figs []Figure, err error, p *Printer, jsonOut bool) {
	c.Compare(figs)
	Finish(name, c, err, func(c *Comparison[S], e string) { c.Error = e },
		func(c *Comparison[S]) { c.Verdict(); c.Report(p) }, jsonOut)
	for _, k := range c.Checks {
		if !k.Plain || !k.TLS {
			os.Exit(1)
		}
	}
}
