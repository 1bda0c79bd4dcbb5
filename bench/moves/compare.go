package main

// --compare-json BASE,NEW: the side-by-side of two runs' JSON summaries
// with the same parameters, the first from a baseline tree's bench (an
// older commit: `bench/moves/run --baseline REV` builds and runs both, one
// after the other, on one environment), with issue 39's goals checked on
// the second.

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/shardvisor/shardvisor/internal/benchkit"
)

// summaryJSON is what the comparison reads of a summary: what every
// version of it has.
type summaryJSON struct {
	Moves []struct {
		State   string  `json:"state"`
		Rows    int64   `json:"rows_copied"`
		TotalMS float64 `json:"total_ms"`
		PauseMS float64 `json:"pause_ms"`
		Phases  []struct {
			Phase string  `json:"phase"`
			MS    float64 `json:"ms"`
		} `json:"phases"`
	} `json:"moves"`
	raw map[string]any // every figure, by its JSON path (fig)
}

func readSummary(path string) (*summaryJSON, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s summaryJSON
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := json.Unmarshal(b, &s.raw); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &s, nil
}

// fig is the figure at a JSON path ("pause_ms.p99"); ok is false when the
// summary has none.
func (s *summaryJSON) fig(path string) (float64, bool) {
	var v any = s.raw
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return 0, false
		}
		v = m[k]
	}
	x, ok := v.(float64)
	return x, ok
}

// small is the wall time of the moves done of at most smallRows rows.
func (s *summaryJSON) small() benchkit.Stat {
	var xs []float64
	for _, m := range s.Moves {
		if m.State == "done" && m.Rows <= smallRows {
			xs = append(xs, m.TotalMS)
		}
	}
	return benchkit.Of(xs)
}

// pauseAfterFreeze is the write pause as movers before issue 39 recorded
// it, from the freeze's commit on: the pause less its freeze phase (a
// summary without phases recorded it so).
func (s *summaryJSON) pauseAfterFreeze() benchkit.Stat {
	var xs []float64
	for _, m := range s.Moves {
		if m.State != "done" {
			continue
		}
		p := m.PauseMS
		for _, ph := range m.Phases {
			if ph.Phase == "freeze" {
				p -= ph.MS
			}
		}
		xs = append(xs, p)
	}
	return benchkit.Of(xs)
}

// compareJSON prints the comparison of two summaries and reports whether
// the second meets issue 39's goals.
func compareJSON(basePath, newPath string) (bool, error) {
	base, err := readSummary(basePath)
	if err != nil {
		return false, err
	}
	cur, err := readSummary(newPath)
	if err != nil {
		return false, err
	}
	met := true
	row := func(name string, b, n float64, goal string, ok bool) {
		verdict := ""
		if goal != "" {
			verdict = goal + " " + benchkit.Verdict(ok)
			met = met && ok
		}
		say("  %-40s %10.1f %10.1f %8s  %s", name, b, n, benchkit.RatioX(n, b), verdict)
	}
	say("\nthis tree vs the baseline: same parameters, one run after the other on one environment (baseline first)")
	say("  %-40s %10s %10s %8s  %s", "figure", "baseline", "this tree", "ratio", "goal (this tree)")
	for _, f := range []struct {
		name, path, goal string
		max              float64
	}{
		{"write pause p50 (ms, mover record)", "pause_ms.p50", "", 0},
		{"write pause p99 (ms, mover record)", "pause_ms.p99", "<= 50", 50},
		{"write pause max (ms)", "pause_ms.max", "", 0},
		{"move wall time p50 (ms)", "move_total_ms.p50", "", 0},
		{"fence step p50 (ms, member wait + freeze)", "fence_step_ms.p50", "", 0},
		{"write p99 through router.Do (ms)", "write_latency_ms.p99", "", 0},
		{"writes/s during the moves", "writes_per_s_during_moves", "", 0},
		{"rebalance (s)", "rebalance_seconds", "", 0},
	} {
		b, _ := base.fig(f.path)
		n, ok := cur.fig(f.path)
		row(f.name, b, n, f.goal, ok && (f.max == 0 || n <= f.max))
	}
	// Like with like: this tree's pause starts as the freeze is sent (its
	// drain and commit included), the baseline's started at its commit.
	bp, np := base.pauseAfterFreeze(), cur.pauseAfterFreeze()
	row("pause from the freeze's commit p50 (ms)", bp.P50, np.P50, "", true)
	row("pause from the freeze's commit p99 (ms)", bp.P99, np.P99, "", true)
	bs, ns := base.small(), cur.small()
	row(fmt.Sprintf("moves of <= %d rows: wall p50 (ms)", smallRows), bs.P50, ns.P50, "<= 1000", ns.N > 0 && ns.P50 <= 1000)
	row(fmt.Sprintf("moves of <= %d rows: wall max (ms)", smallRows), bs.Max, ns.Max, "<= 3000", ns.N > 0 && ns.Max <= 3000)
	for _, z := range []struct{ name, path string }{{"acknowledged writes lost", "missing_acknowledged_writes"},
		{"moves aborted", "moves_aborted"}, {"failed writes", "writes_failed"}} {
		b, _ := base.fig(z.path)
		n, ok := cur.fig(z.path)
		row(z.name, b, n, "0", ok && n == 0)
	}
	say("  issue 39's goals on this tree: %s", benchkit.Verdict(met))
	return met, nil
}
