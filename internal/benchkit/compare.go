package benchkit

import (
	"encoding/json"
	"flag"
	"os"
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

// TLSGoal is issue 38's bound on a latency's ratio TLS/plain.
const TLSGoal = 1.15

// Pair is one figure of both runs of a comparison.
type Pair struct {
	Name  string  `json:"name"`
	Plain float64 `json:"plain"`
	TLS   float64 `json:"tls"`
	// Ratio is TLS/plain; nil when the plain figure is 0.
	Ratio *float64 `json:"ratio_tls_over_plain"`
	// Goal bounds Ratio (0: the figure is for information).
	Goal float64 `json:"goal,omitempty"`
	Met  bool    `json:"met"`
}

// Check is a condition each run must meet on its own (no acknowledged
// write lost, say).
type Check struct {
	Name  string `json:"name"`
	Plain bool   `json:"plain"`
	TLS   bool   `json:"tls"`
}

// Comparison is a side-by-side run: both runs' summaries, the figures
// compared, the checks, and the machine's load after each run.
type Comparison[S any] struct {
	Plain   *S       `json:"plain"`
	TLS     *S       `json:"tls"`
	Pairs   []Pair   `json:"ratios"`
	Checks  []Check  `json:"checks"`
	Met     bool     `json:"met"`
	LoadAvg []string `json:"load_avg_after_each_run"`
	Error   string   `json:"error,omitempty"`
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

// Compare adds figs, read from both summaries, to the pairs and checks.
func (c *Comparison[S]) Compare(figs []Figure) {
	plain, tls := decode(c.Plain), decode(c.TLS)
	for _, f := range figs {
		p, ok1 := at(plain, f.Path)
		t, ok2 := at(tls, f.Path)
		switch {
		case !ok1 || !ok2:
		case f.Zero:
			c.Checks = append(c.Checks, Check{f.Name, p == 0, t == 0})
		default:
			x := Pair{Name: f.Name, Plain: p, TLS: t, Goal: f.Goal, Met: f.Goal == 0 || p == 0 && t == 0}
			if p != 0 {
				r := t / p
				x.Ratio, x.Met = &r, f.Goal == 0 || r <= f.Goal
			}
			c.Pairs = append(c.Pairs, x)
		}
	}
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
	c.Met = c.Plain != nil && c.TLS != nil && c.Error == ""
	for _, p := range c.Pairs {
		c.Met = c.Met && p.Met
	}
	for _, k := range c.Checks {
		c.Met = c.Met && k.Plain && k.TLS
	}
}

// Report prints the comparison's table.
func (c *Comparison[S]) Report(p *Printer) {
	load := strings.Join(append(c.LoadAvg, "-", "-")[:2], "; TLS ")
	p.Say("\nTLS vs plain: same parameters, one run after the other on this machine (load average 1, 5, 15 min after each: plain %s)", load)
	p.Say("  %-44s %10s %10s %10s  %s", "figure", "plain", "TLS", "TLS/plain", "goal")
	for _, x := range c.Pairs {
		goal := "(information)"
		if x.Goal > 0 {
			goal = "<= " + RatioX(x.Goal, 1) + " " + Verdict(x.Met)
		}
		p.Say("  %-44s %10.1f %10.1f %10s  %s", x.Name, x.Plain, x.TLS, RatioX(x.TLS, x.Plain), goal)
	}
	for _, k := range c.Checks {
		p.Say("  %-44s %10s %10s", k.Name, Verdict(k.Plain), Verdict(k.TLS))
	}
	if c.Error != "" {
		p.Say("  ERROR: %s", c.Error)
	}
	p.Say("  issue 38's goals: %s", Verdict(c.Met))
}
