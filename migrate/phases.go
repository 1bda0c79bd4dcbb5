package migrate

// Where a move's time goes: each phase's time (topo.MovePhases) is added
// to the record's stats, so that `move status`, the rebalance's lines and
// the benches say which phase a slow move spent it in.

import (
	"fmt"
	"strings"
	"time"

	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/topo"
)

// phaseMark is a phase's start: the time, and how long the run had spent
// saving the record by then.
type phaseMark struct {
	at  time.Time
	rec time.Duration
}

// runPhases is the run's phase bookkeeping.
type runPhases struct {
	// recordSpent is the time this run spent saving the record (every
	// phase leaves it out: PhaseRecord has it).
	recordSpent time.Duration
	// stepMark is when the current state's step began (drive sets it).
	stepMark phaseMark
}

func (r *run) mark() phaseMark { return phaseMark{at: time.Now(), rec: r.recordSpent} }

// timed adds to phase the time since m, less the record's saves meanwhile.
func (r *run) timed(phase string, m phaseMark) {
	r.rec.Stats.AddPhase(phase, time.Since(m.at)-(r.recordSpent-m.rec))
}

// stepPhases are the states whose whole step is one phase; the others
// time their phases inside the step.
var stepPhases = map[string]string{
	topo.MovePrepare: topo.PhasePrepare, topo.MoveTeardown: topo.PhaseTeardown, topo.MoveReverse: topo.PhaseReverseStart,
	topo.MoveVerify: topo.PhaseVerify, topo.MoveCompleting: topo.PhaseComplete,
}

// leaving is called as the record leaves its state for next, before it is
// saved: a state that is one phase adds its step's time, and a move that
// ends gets its wall time.
func (r *run) leaving(next string) {
	if p, ok := stepPhases[r.rec.State]; ok && !r.stepMark.at.IsZero() {
		r.timed(p, r.stepMark)
		r.stepMark = r.mark()
	}
	if topo.MoveStateFinal(next) {
		r.rec.Stats.TotalMS = benchkit.MS(time.Since(r.rec.CreatedAt))
	}
}

// saved accounts for one save of the record that took d.
func (r *run) saved(d time.Duration) {
	r.recordSpent += d
	r.rec.Stats.AddPhase(topo.PhaseRecord, d)
}

// PhaseStat is one phase's time over a set of moves (nearest-rank
// percentiles, benchkit.Of, as every bench reports them).
type PhaseStat struct {
	Phase string  `json:"phase"`
	Moves int     `json:"moves"` // moves that spent time in it
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	MaxMS float64 `json:"max_ms"`
}

// Pseudo-phases of SummarizePhases: a move's wall time and its write pause.
const (
	SummaryTotal = "total"
	SummaryPause = "pause"
)

// SummarizePhases summarizes the moves that flipped (done, reversible, or
// later): their wall time (SummaryTotal: created to ended, or to the
// record's last change for one in its window), their write pause
// (SummaryPause) and each phase, in topo.MovePhases' order.
func SummarizePhases(recs []*topo.MoveRecord) []PhaseStat {
	by := map[string][]float64{}
	for _, r := range recs {
		if r == nil || r.FlipVersion == 0 {
			continue
		}
		by[SummaryTotal] = append(by[SummaryTotal], r.ElapsedMS())
		by[SummaryPause] = append(by[SummaryPause], r.Stats.PauseMS)
		for _, p := range r.Stats.Phases {
			by[p.Phase] = append(by[p.Phase], p.MS)
		}
	}
	var out []PhaseStat
	for _, ph := range append([]string{SummaryTotal, SummaryPause}, topo.MovePhases...) {
		if xs := by[ph]; len(xs) > 0 {
			s := benchkit.Of(xs)
			out = append(out, PhaseStat{Phase: ph, Moves: s.N, P50MS: s.P50, P99MS: s.P99, MaxMS: s.Max})
		}
	}
	return out
}

// DescribeSummary prints SummarizePhases' p50s on one line: "12 moves, p50:
// total 610 ms, pause 12.1 ms (p99 19.2); slot 21, copy 45, ... ms".
// Phases under 1 ms at p50 are left out.
func DescribeSummary(stats []PhaseStat) string {
	if len(stats) == 0 {
		return ""
	}
	var b strings.Builder
	var rest []string
	for _, s := range stats {
		switch s.Phase {
		case SummaryTotal:
			fmt.Fprintf(&b, "%d moves, p50: total %.0f ms (max %.0f)", s.Moves, s.P50MS, s.MaxMS)
		case SummaryPause:
			fmt.Fprintf(&b, ", pause %.1f ms (p99 %.1f)", s.P50MS, s.P99MS)
		default:
			if s.P50MS >= 1 {
				rest = append(rest, fmt.Sprintf("%s %.0f", s.Phase, s.P50MS))
			}
		}
	}
	if len(rest) > 0 {
		fmt.Fprintf(&b, "; %s ms", strings.Join(rest, ", "))
	}
	return b.String()
}

// movedLine is the rebalance's line for a move that flipped: its wall time
// with the phases that took 10 ms or more, and its pause with its phases.
func movedLine(rec *topo.MoveRecord) string {
	s := fmt.Sprintf("moved bucket %s %s -> %s: %d rows in %.0f ms", recBucket(rec), rec.Source, rec.Target, rec.Stats.RowsCopied, rec.ElapsedMS())
	if ph := rec.Stats.DescribePhases(10*time.Millisecond, false); ph != "" {
		s += " (" + ph + ")"
	}
	s += fmt.Sprintf(", pause %.1f ms", rec.Stats.PauseMS)
	if p := rec.Stats.DescribePause(); p != "" {
		s += " (" + p + ")"
	}
	return s
}
