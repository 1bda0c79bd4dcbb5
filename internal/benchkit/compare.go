package benchkit

import (
	"encoding/json"
	"flag"
	"os"
	"slices"
	"strconv"
	"strings"
)

// CompareFlag declares --compare-tls: a benchmark run twice with the same
// parameters, in the plain mode and with ZooKeeper over TLS, side by side
// (issue 38; internal/clustertest's CompareTLS runs them).
func CompareFlag() *bool {
	return flag.Bool("compare-tls", os.Getenv("SHARDVISOR_BENCH_COMPARE_TLS") == "1",
		"run twice with the same parameters, the plain mode then ZooKeeper over TLS with x509 identities, each on an environment of its own "+
			"brought up and down (the TLS one in SHARDVISOR_BENCH_TLS_DIR on SHARDVISOR_BENCH_TLS_ZK_PORT_BASE and _PG_PORT_BASE), "+
			"and print both and the ratios TLS/plain (env SHARDVISOR_BENCH_COMPARE_TLS=1)")
}

// TLSGoal is issue 38's bound on a latency's ratio TLS/plain (issue 41
// keeps it for the write p99 through router.Do).
const TLSGoal = 1.15

// TLSPauseGoal is issue 41's bound on the move pause's p99, TLS/plain:
// with PostgreSQL over TLS too, the pause crosses more encrypted hops.
const TLSPauseGoal = 1.2

// RoundsFlag declares --rounds: how many times a --compare-tls
// comparison runs each mode, alternating which goes first (plain-TLS,
// TLS-plain, ...), so that one run's luck and the order do not decide a
// ratio: each ratio is then the median of the rounds'. An even number
// balances the order; 4 or more outvote one odd round.
func RoundsFlag() *int {
	return flag.Int("rounds", EnvInt("SHARDVISOR_BENCH_ROUNDS", 1), "with --compare-tls: run each mode this many times, "+
		"alternating which goes first; each ratio is the median of the rounds' (even, 4 or more: the order balanced, one odd round outvoted) (env SHARDVISOR_BENCH_ROUNDS)")
}

// Pair is one figure of both modes of a comparison: with more than one
// round, the median of each mode's rounds, and every round's figures.
type Pair struct {
	Name  string  `json:"name"`
	Plain float64 `json:"plain"`
	TLS   float64 `json:"tls"`
	// PlainRounds and TLSRounds are the figure in each round, in order
	// (only with more than one round).
	PlainRounds []float64 `json:"plain_rounds,omitempty"`
	TLSRounds   []float64 `json:"tls_rounds,omitempty"`
	// Ratio is TLS/plain; nil when the plain figure is 0.
	Ratio *float64 `json:"ratio_tls_over_plain"`
	// Goal bounds Ratio (0: the figure is for information).
	Goal float64 `json:"goal,omitempty"`
	Met  bool    `json:"met"`
}

// Check is a condition each run must meet on its own (no acknowledged
// write lost, say): with more than one round, every run of the mode.
type Check struct {
	Name  string `json:"name"`
	Plain bool   `json:"plain"`
	TLS   bool   `json:"tls"`
}

// Comparison is a side-by-side run: both modes' summaries (the first
// round's, and those of any further rounds), the figures compared, the
// checks, and the machine's load after each run.
type Comparison[S any] struct {
	// Modes name the two modes, the baseline first: "plain" and "TLS"
	// when empty (the TLS comparisons'), "direct" and "pooler" for the
	// pooler's (issue 42). Plain holds the baseline's summary, TLS the
	// other mode's, whatever their names.
	Modes []string `json:"modes,omitempty"`
	Plain *S       `json:"plain"`
	TLS   *S       `json:"tls"`
	// TLSFirst: the first round ran the TLS mode first.
	TLSFirst bool `json:"tls_first,omitempty"`
	// More are the rounds after the first (--rounds) that finished.
	More []Round[S] `json:"more_rounds,omitempty"`
	// Failed is the round whose run failed (Error says how), after the
	// rounds in More, with what summaries it has: in no figure.
	Failed  *Round[S] `json:"failed_round,omitempty"`
	Pairs   []Pair    `json:"ratios"`
	Checks  []Check   `json:"checks"`
	Met     bool      `json:"met"`
	LoadAvg []string  `json:"load_avg_after_each_run"` // "MODE 1m 5m 15m", in the order run
	Error   string    `json:"error,omitempty"`
}

// Round is one run of each mode; TLSFirst says which ran first.
type Round[S any] struct {
	Plain    *S   `json:"plain"`
	TLS      *S   `json:"tls"`
	TLSFirst bool `json:"tls_first"`
}

// Figure is a number both runs' JSON summaries hold at Path: keys joined
// by dots, a list's element by its index or by the value of one of its
// string fields ("write_latency_ms.p99", "modes.sync.p99_before_ms"). It
// is compared as TLS/plain against Goal (0: for information), or, with
// Zero, checked to be 0 in each run. A figure missing from either summary
// is left out (a mode not run, say).
type Figure struct {
	Name, Path string
	Goal       float64
	Zero       bool
}

// Compare adds figs, read from both modes' summaries, to the pairs and
// checks. With more than one round, a pair's ratio is the median of the
// rounds' ratios (each TLS run over the plain run of its round), its
// figures each mode's median, and a check must hold in every round; a
// figure missing from any summary is left out. Only rounds that finished
// are here: a failed one is in Failed.
func (c *Comparison[S]) Compare(figs []Figure) {
	plains, tlss := []any{decode(c.Plain)}, []any{decode(c.TLS)}
	for _, r := range c.More {
		plains, tlss = append(plains, decode(r.Plain)), append(tlss, decode(r.TLS))
	}
	for _, f := range figs {
		ps, ok1 := allAt(plains, f.Path)
		ts, ok2 := allAt(tlss, f.Path)
		switch {
		case !ok1 || !ok2:
		case f.Zero:
			c.Checks = append(c.Checks, Check{f.Name, allZero(ps), allZero(ts)})
		default:
			x := Pair{Name: f.Name, Plain: median(ps), TLS: median(ts), Goal: f.Goal, Met: f.Goal == 0 || allZero(ps) && allZero(ts)}
			if len(ps) > 1 {
				x.PlainRounds, x.TLSRounds = ps, ts
			}
			// Each round's ratio pairs the runs that ran back to back; the
			// median of those is the figure (a round whose plain figure is
			// 0 has none).
			var rs []float64
			for i := range ps {
				if ps[i] != 0 {
					rs = append(rs, ts[i]/ps[i])
				}
			}
			if len(rs) > 0 {
				r := median(rs)
				x.Ratio, x.Met = &r, f.Goal == 0 || r <= f.Goal
			}
			c.Pairs = append(c.Pairs, x)
		}
	}
}

// allAt is the figure at path in each of vs; ok is false if one has none.
func allAt(vs []any, path string) (xs []float64, ok bool) {
	for _, v := range vs {
		x, ok := at(v, path)
		if !ok {
			return nil, false
		}
		xs = append(xs, x)
	}
	return xs, true
}

func allZero(xs []float64) bool {
	for _, x := range xs {
		if x != 0 {
			return false
		}
	}
	return true
}

// median of xs (not empty): the middle value, or the mean of the two
// middle ones.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// decode is v as JSON values (nil when v is nil or does not encode).
func decode(v any) any {
	var out any
	if b, err := json.Marshal(v); err == nil {
		_ = json.Unmarshal(b, &out)
	}
	return out
}

// at is the number (or bool, as 1 or 0) at path in v.
func at(v any, path string) (float64, bool) {
	for _, k := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			v = x[k]
		case []any:
			i, err := strconv.Atoi(k)
			v = nil
			for j, e := range x {
				if m, ok := e.(map[string]any); err == nil && j == i || ok && hasString(m, k) {
					v = e
					break
				}
			}
		default:
			return 0, false
		}
	}
	switch x := v.(type) {
	case float64:
		return x, true
	case bool:
		return map[bool]float64{true: 1}[x], true
	}
	return 0, false
}

// hasString says whether one of m's string fields is k.
func hasString(m map[string]any, k string) bool {
	for _, v := range m {
		if v == k {
			return true
		}
	}
	return false
}

// Verdict sets Met: every bounded ratio and every check met, both runs
// done.
func (c *Comparison[S]) Verdict() {
	c.Met = c.Plain != nil && c.TLS != nil && c.Error == "" && c.Failed == nil
	for _, r := range c.More {
		c.Met = c.Met && r.Plain != nil && r.TLS != nil
	}
	for _, p := range c.Pairs {
		c.Met = c.Met && p.Met
	}
	for _, k := range c.Checks {
		c.Met = c.Met && k.Plain && k.TLS
	}
}

// Report prints the comparison's table.
func (c *Comparison[S]) Report(p *Printer) {
	base, other, issue := "plain", "TLS", "issue 38's"
	if len(c.Modes) == 2 {
		base, other, issue = c.Modes[0], c.Modes[1], "the"
	}
	if len(c.More) == 0 {
		p.Say("\n%s vs %s: same parameters, one run after the other on this machine (load average 1, 5, 15 min after each: %s)", other, base, strings.Join(c.LoadAvg, "; "))
	} else {
		p.Say("\n%s vs %s: same parameters, %d rounds on this machine, alternating which mode runs first; each mode's figure its median over the rounds, "+
			"the ratio the median of the rounds' ratios (load average 1, 5, 15 min after each run, in order: %s)", other, base, len(c.More)+1, strings.Join(c.LoadAvg, "; "))
	}
	p.Say("  %-44s %10s %10s %10s  %s", "figure", base, other, other+"/"+base, "goal")
	for _, x := range c.Pairs {
		goal := "(information)"
		if x.Goal > 0 {
			goal = "<= " + RatioX(x.Goal, 1) + " " + Verdict(x.Met)
		}
		if len(x.PlainRounds) > 0 {
			var rs []string
			for i := range x.PlainRounds {
				rs = append(rs, RatioX(x.TLSRounds[i], x.PlainRounds[i]))
			}
			goal += "  rounds: " + strings.Join(rs, " ")
		}
		ratio := "n/a"
		if x.Ratio != nil {
			ratio = RatioX(*x.Ratio, 1) // with rounds, the median of theirs: not TLS/Plain of the medians
		} else if x.Plain == 0 && x.TLS == 0 {
			ratio = RatioX(0, 0)
		}
		p.Say("  %-44s %10.1f %10.1f %10s  %s", x.Name, x.Plain, x.TLS, ratio, goal)
	}
	for _, k := range c.Checks {
		p.Say("  %-44s %10s %10s", k.Name, Verdict(k.Plain), Verdict(k.TLS))
	}
	if c.Error != "" {
		p.Say("  ERROR: %s", c.Error)
	}
	p.Say("  %s goals: %s", issue, Verdict(c.Met))
}
