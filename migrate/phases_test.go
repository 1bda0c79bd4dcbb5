package migrate

import (
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/topo"
)

// SummarizePhases counts only moves that flipped, takes a move's wall time
// from total_ms once it ended (else created to last change), and gives
// nearest-rank percentiles per phase.
func TestSummarizePhases(t *testing.T) {
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	rec := func(flip uint64, total float64, updated time.Duration, pause float64, copyMS ...float64) *topo.MoveRecord {
		r := &topo.MoveRecord{FlipVersion: flip, CreatedAt: at, UpdatedAt: at.Add(updated)}
		r.Stats.TotalMS, r.Stats.PauseMS = total, pause
		for _, c := range copyMS {
			r.Stats.AddPhase(topo.PhaseCopy, time.Duration(c*float64(time.Millisecond)))
		}
		return r
	}
	recs := []*topo.MoveRecord{
		rec(5, 400, time.Hour, 10, 100),
		rec(7, 0, 600*time.Millisecond, 30, 300), // in its window: created to last change
		rec(9, 500, 0, 20, 200),
		rec(0, 50, 0, 0, 999), // aborted before its flip: left out
		nil,
	}
	got := map[string]PhaseStat{}
	for _, s := range SummarizePhases(recs) {
		got[s.Phase] = s
	}
	if s := got[SummaryTotal]; s.Moves != 3 || s.P50MS != 500 || s.MaxMS != 600 {
		t.Fatalf("total: %+v", s)
	}
	if s := got[SummaryPause]; s.P50MS != 20 || s.P99MS != 30 {
		t.Fatalf("pause: %+v", s)
	}
	if s := got[topo.PhaseCopy]; s.Moves != 3 || s.P50MS != 200 || s.MaxMS != 300 {
		t.Fatalf("copy: %+v", s)
	}
	line := DescribeSummary(SummarizePhases(recs))
	if !strings.HasPrefix(line, "3 moves, p50: total 500 ms (max 600), pause 20.0 ms (p99 30.0); copy 200 ms") {
		t.Fatalf("DescribeSummary: %q", line)
	}
	if DescribeSummary(nil) != "" {
		t.Fatal("an empty summary prints something")
	}
}
