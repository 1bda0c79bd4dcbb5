package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/topo"
)

// MoveRow is one move's figures.
type MoveRow struct {
	ID      string  `json:"id"`
	Bucket  uint32  `json:"bucket"`
	Level   int     `json:"level"`
	From    string  `json:"from"`
	To      string  `json:"to"`
	State   string  `json:"state"`
	Rows    int64   `json:"rows_copied"`
	CopyMS  float64 `json:"copy_ms"`
	RowsPS  float64 `json:"copy_rows_per_s"`
	LagMS   float64 `json:"lag_at_fence_ms"`
	PauseMS float64 `json:"pause_ms"`
	// Steps of the write pause, from the record's step timestamps.
	FenceMS   float64 `json:"fence_step_ms"`   // fence -> barrier: map says moving, members caught up, source frozen
	BarrierMS float64 `json:"barrier_step_ms"` // barrier -> flip: marker round trip, verification snapshot
	FlipMS    float64 `json:"flip_step_ms"`    // the rest of the pause: the map and the record in one ZooKeeper CAS
	TotalMS   float64 `json:"total_ms"`        // created -> done
	VerifyMS  float64 `json:"verify_ms"`       // the verify step: both snapshots counted and summed
	// RouterMS: the router's map said moving for this long (-1: never seen).
	RouterMS float64 `json:"router_pause_ms"`
	// ClientMS: the longest write to the bucket around the pause (-1: none).
	ClientMS float64 `json:"client_stall_ms"`
	VerifyOK bool    `json:"verify_ok"`
	// The copy step, from the nodes' activity (-1: not seen): ms from its
	// start until the move's slot was created, until its COPYs began and
	// until its apply worker connected (after the COPYs: the subscription
	// is enabled once they committed); the COPYs; from their end to the
	// end of the step.
	SlotMS     float64 `json:"copy_slot_ms"`
	LaunchMS   float64 `json:"copy_apply_worker_ms"`
	StartMS    float64 `json:"copy_start_ms"`
	DataMS     float64 `json:"copy_data_ms"`
	DataRowsPS float64 `json:"copy_data_rows_per_s"`
	HandoverMS float64 `json:"copy_handover_ms"`
	Error      string  `json:"error,omitempty"`
	// Phases is where the move's time went, from its record.
	Phases []topo.PhaseTime `json:"phases,omitempty"`
	// When the move began, and its fence and teardown steps.
	startedAt, fenceAt, teardownAt time.Time
	rec                            *topo.MoveRecord
}

// BaselineRun is one plain COPY of a moved bucket's range.
type BaselineRun struct {
	Bucket uint32  `json:"bucket"`
	From   string  `json:"from"`
	To     string  `json:"to"`
	Rows   int64   `json:"rows"`
	MS     float64 `json:"ms"`
	RowsPS float64 `json:"rows_per_s"`
}

// Summary is everything the run found.
type Summary struct {
	Cores         int     `json:"cores"`
	Level         int     `json:"level"`
	Buckets       int     `json:"buckets"`
	RowsPerBucket int     `json:"rows_per_bucket"`
	RowsLoaded    int64   `json:"rows_loaded"`
	LoadSeconds   float64 `json:"load_seconds"`
	Writers       int     `json:"writers"`
	Rate          int     `json:"rate"`
	Concurrency   int     `json:"concurrency"`
	// Pooler: the router wrote through each node's PgBouncer.
	Pooler   bool   `json:"pooler"`
	Database string `json:"database"`
	ZKRoot   string `json:"zk_root"`
	Kept     bool   `json:"kept"`
	// The moves, their outcomes and the pause's goal.
	RebalanceSecs  float64                  `json:"rebalance_seconds"`
	Balanced       bool                     `json:"balanced"`
	Restarts       int                      `json:"rebalancer_restarts"`
	FinalCounts    map[bucketmap.NodeID]int `json:"final_bucket_counts"`
	MovesDone      int                      `json:"moves_done"`
	MovesAborted   int                      `json:"moves_aborted"`
	VerifyOK       int                      `json:"verify_ok"`
	RowsMoved      int64                    `json:"rows_moved"`
	PauseTargetMet bool                     `json:"pause_target_met"`
	Moves          []MoveRow                `json:"moves"`
	// Phases: each phase's time over the moves done (and total, pause),
	// as the rebalance reports it (migrate.SummarizePhases).
	Phases []migrate.PhaseStat `json:"phases,omitempty"`
	// SmallMoves: the wall time of the moves of at most smallRows rows.
	SmallMoves benchkit.Stat `json:"small_move_total_ms"`
	// The copy against the baseline's plain COPY pipe.
	CopyRatio float64       `json:"copy_ratio_mover_over_baseline"`
	DataRatio float64       `json:"copy_data_ratio_over_baseline"`
	Baseline  []BaselineRun `json:"baseline"`
	// Rollbacks: moves made with a rollback window after the rebalance,
	// each rolled back at once under the same load; their rollback moves'
	// write pauses are rollback_pause_ms (issue 25's goal: p99 under 50 ms).
	Rollbacks []MoveRow `json:"rollbacks,omitempty"`

	WritesPerSecBefore float64 `json:"writes_per_s_before"`
	// WarmupSecs and SteadySecs: the load's phases before the node is
	// added (their writes are not in write_latency_ms).
	WarmupSecs float64 `json:"warmup_seconds"`
	SteadySecs float64 `json:"steady_seconds"`
	// ZKWarmupOps: ZooKeeper requests sent in the warm-up (warmZK).
	ZKWarmupOps        int64   `json:"zk_warmup_ops"`
	WritesPerSecDuring float64 `json:"writes_per_s_during_moves"`
	WritesAcked        int64   `json:"writes_acknowledged"`
	WritesFailed       int64   `json:"writes_failed"`
	WritesGaveUp       int64   `json:"writes_gave_up"`
	LastWriteError     string  `json:"last_write_error,omitempty"`

	Check
	Leftovers []string `json:"leftovers,omitempty"`
	Error     string   `json:"error,omitempty"`

	// Stats are the run's distributions (ms, or rows/s) by their JSON
	// names written beside the fields above (MarshalJSON).
	Stats map[string]benchkit.Stat `json:"-"`

	// Big is the big-bucket mode's (--big-rows) result; nil otherwise.
	Big *BigRun `json:"big,omitempty"`
}

// moveStats name the distributions over the moves done, in three groups
// by which values count: all of them, the known ones (-1 is "not seen"),
// the positive ones. MoveRow.stats gives the values in the same order.
var (
	moveStats = [3][]string{{"pause_ms", "fence_step_ms", "barrier_step_ms", "flip_step_ms", "lag_at_fence_ms", "move_total_ms", "copy_ms", "mover_copy_rows_per_s"},
		{"router_pause_ms", "client_stall_ms", "copy_slot_ms", "copy_apply_worker_ms", "copy_start_ms", "copy_data_ms", "copy_handover_ms"},
		{"copy_data_rows_per_s"}}
	moveStatKeep = [3]func(float64) bool{func(float64) bool { return true }, func(x float64) bool { return x >= 0 }, func(x float64) bool { return x > 0 }}
)

func (m *MoveRow) stats() [3][]float64 {
	return [3][]float64{{m.PauseMS, m.FenceMS, m.BarrierMS, m.FlipMS, m.LagMS, m.TotalMS, m.CopyMS, m.RowsPS},
		{m.RouterMS, m.ClientMS, m.SlotMS, m.LaunchMS, m.StartMS, m.DataMS, m.HandoverMS}, {m.DataRowsPS}}
}

// MarshalJSON writes every distribution, empty ones included, beside the
// other fields.
func (s *Summary) MarshalJSON() ([]byte, error) {
	type plain Summary
	st := map[string]benchkit.Stat{}
	for _, k := range slices.Concat([]string{"rollback_pause_ms", "baseline_copy_rows_per_s"}, writeStats[:], probeStats[:], moveStats[0], moveStats[1], moveStats[2]) {
		st[k] = s.Stats[k]
	}
	a, err := json.Marshal((*plain)(s))
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(st)
	return append(append(a[:len(a)-1], ','), b[1:]...), err
}

// writeStats are the writes' latencies: from the node's addition on, then
// by phase (phaseLatencies).
var writeStats = [...]string{"write_latency_ms", "write_latency_warmup_ms", "write_latency_steady_ms", "write_latency_rebalance_ms",
	"write_latency_moving_ms", "write_latency_not_moving_ms", "write_latency_after_ms"}

const pauseTarget = 50.0 // ms, p99 (issue 39; issue 7 set 100)

// smallRows is the size of a small bucket, whose move issue 39 wants done
// in a second at p50, 3 s at most.
const smallRows = 5000

func report(s *Summary) {
	if s.Big != nil {
		reportBig(s)
		return
	}
	ms := func(k string) string { return s.Stats[k].MS() }
	say("\nmove benchmark (issue 7): %d -> %d PostgreSQL nodes, level %d (%d buckets), %d rows/bucket (%s rows loaded in %.0f s), %d writers%s%s, concurrency %d, %d cores",
		startNodes, startNodes+1, s.Level, s.Buckets, s.RowsPerBucket, human(float64(s.RowsLoaded)), s.LoadSeconds, s.Writers,
		map[bool]string{true: fmt.Sprintf(" at %d writes/s", s.Rate), false: " (closed loop)"}[s.Rate > 0],
		map[bool]string{true: " through each node's PgBouncer", false: ""}[s.Pooler], s.Concurrency, s.Cores)
	say("  moves:            %d done, %d aborted, verified %d/%d; %s rows moved; rebalance %.1f s (balanced: %v, buckets now %v)",
		s.MovesDone, s.MovesAborted, s.VerifyOK, len(s.Moves), human(float64(s.RowsMoved)), s.RebalanceSecs, s.Balanced, s.FinalCounts)
	if s.Restarts > 0 {
		say("                    the rebalancer stopped on an aborted move and was run again %d time(s)", s.Restarts)
	}
	for _, m := range s.Moves {
		if m.State != topo.MoveDone {
			say("                    move %s (bucket %d %s -> %s) %s: %s", m.ID, m.Bucket, m.From, m.To, m.State, m.Error)
		}
	}
	say("  write pause per move (mover record: source frozen -> map flipped, ZooKeeper CAS included)")
	say("                    %s   target p99 <= %.0f ms: %s", ms("pause_ms"), pauseTarget, benchkit.Verdict(s.PauseTargetMet))
	say("    steps:  fence (map moving, routers caught up, freeze)  %s", ms("fence_step_ms"))
	say("            barrier (marker applied on target, snapshot)    %s", ms("barrier_step_ms"))
	say("            flip (map + move record: one ZooKeeper CAS)     %s", ms("flip_step_ms"))
	say("  moving window as the router saw it (map says moving -> map flipped; writes go on to the source until its freeze)")
	say("                    %s", ms("router_pause_ms"))
	say("  longest client write to the bucket that began while it was moving (router.Do: fence rejections and retries included;")
	say("  for information: it also holds the write load's own latency tail, see below)")
	say("                    %s", ms("client_stall_ms"))
	say("  replication lag at fence: %s", ms("lag_at_fence_ms"))
	say("  move duration:    %s", ms("move_total_ms"))
	say("  moves of <= %d rows: %s   target p50 <= 1000, max <= 3000 ms: %s", smallRows, s.SmallMoves.MS(),
		benchkit.Verdict(s.SmallMoves.N > 0 && s.SmallMoves.P50 <= 1000 && s.SmallMoves.Max <= 3000))
	if len(s.Phases) > 0 {
		say("  where a move's time goes (its record's phases; the pause's are marked *):")
		for _, p := range s.Phases {
			mark := " "
			if slices.Contains(topo.PausePhases, p.Phase) {
				mark = "*"
			}
			say("           %s %-14s p50 %8.1f  p99 %8.1f  max %8.1f ms  (n=%d)", mark, p.Phase, p.P50MS, p.P99MS, p.MaxMS, p.Moves)
		}
	}
	ratio := "n/a"
	if s.CopyRatio > 0 {
		ratio = fmt.Sprintf("%.2f", s.CopyRatio)
	}
	say("  copy throughput:  mover median %s rows/s (copy step median %.0f ms), plain COPY pipe median %s rows/s (%d buckets, same nodes, under the same load)",
		human(s.Stats["mover_copy_rows_per_s"].P50), s.Stats["copy_ms"].P50, human(s.Stats["baseline_copy_rows_per_s"].P50), len(s.Baseline))
	say("                    ratio mover/baseline: %s", ratio)
	if s.Stats["copy_data_rows_per_s"].N > 0 {
		say("    where the copy step goes (the nodes' activity, probed every %s):", probeEvery)
		say("            step start -> the move's slot created  %s", ms("copy_slot_ms"))
		say("            step start -> its COPYs start          %s", ms("copy_start_ms"))
		say("            the COPYs (source sends .. target done) %s", ms("copy_data_ms"))
		say("            COPY end -> end of the copy step       %s", ms("copy_handover_ms"))
		say("            step start -> apply worker streaming   %s (enabled once the COPYs committed)", ms("copy_apply_worker_ms"))
		say("            the COPYs alone: median %s rows/s, ratio to the baseline %.2f", human(s.Stats["copy_data_rows_per_s"].P50), s.DataRatio)
	}
	say("  during the moves: PostgreSQL probe query %s", ms("pg_probe_ms"))
	say("                    PostgreSQL new conn.   %s", ms("pg_connect_ms"))
	say("                    ZooKeeper map read     %s", ms("zk_read_ms"))
	say("                    ZooKeeper write        %s", ms("zk_write_ms"))
	say("  write load:       %.0f writes/s before, %.0f writes/s during the moves; %d acknowledged, %d failed (%d gave up after router.Do's retries)",
		s.WritesPerSecBefore, s.WritesPerSecDuring, s.WritesAcked, s.WritesFailed, s.WritesGaveUp)
	say("                    write latency %s from the node's addition on", ms("write_latency_ms"))
	say("                      warm-up (%.0f s) %s; %d ZooKeeper requests beside it", s.WarmupSecs, ms("write_latency_warmup_ms"), s.ZKWarmupOps)
	say("                      steady (%.0f s)  %s", s.SteadySecs, ms("write_latency_steady_ms"))
	say("                      rebalance     %s (bucket moving: %s)", ms("write_latency_rebalance_ms"), ms("write_latency_moving_ms"))
	say("                      after         %s", ms("write_latency_after_ms"))
	if s.LastWriteError != "" {
		say("                    last write error: %s", s.LastWriteError)
	}
	if rb := s.Stats["rollback_pause_ms"]; rb.N > 0 {
		say("  rollbacks:        %d moves rolled back under the load: write pause %s (goal: p99 under 50 ms)", rb.N, rb.MS())
	}
	say("  acknowledged writes missing at the end: %d (of %d users written; target 0)", s.Missing, s.UsersChecked)
	for _, m := range s.MissingSamples {
		say("    %s", m)
	}
	if s.NewerThanAcked > 0 {
		say("  (%d users hold a newer value from a write that failed on the client side: not lost)", s.NewerThanAcked)
	}
	reportEnd(s)
}

// reportEnd ends both reports: what the run left behind, and its error.
func reportEnd(s *Summary) {
	if len(s.Leftovers) > 0 {
		say("  replication objects left behind: %v", s.Leftovers)
	}
	if s.Kept {
		say("  kept: database %s on every node, ZooKeeper %s", s.Database, s.ZKRoot)
	}
	if s.Error != "" {
		say("  ERROR: %s", s.Error)
	}
}

func human(x float64) string {
	switch {
	case x >= 1e6:
		return fmt.Sprintf("%.2fM", x/1e6)
	case x >= 1e4:
		return fmt.Sprintf("%.1fk", x/1e3)
	default:
		return fmt.Sprintf("%.0f", x)
	}
}

// seen is a figure in ms, or "-" when not seen (below 0).
func seen(ms float64, format string) string {
	if ms < 0 {
		return "-"
	}
	return fmt.Sprintf(format, ms)
}

func (b *bench) summarize(s *Summary) {
	for _, m := range s.Moves {
		switch m.State {
		case topo.MoveDone:
			s.MovesDone++
			s.RowsMoved += m.Rows
		case topo.MoveAborted:
			s.MovesAborted++
		}
		if m.VerifyOK {
			s.VerifyOK++
		}
	}
	for g, names := range moveStats {
		for i, name := range names {
			var xs []float64
			for j := range s.Moves {
				if x := s.Moves[j].stats()[g][i]; s.Moves[j].State == topo.MoveDone && moveStatKeep[g](x) {
					xs = append(xs, x)
				}
			}
			s.Stats[name] = benchkit.Of(xs)
		}
	}
	var base []float64
	for _, r := range s.Baseline {
		base = append(base, r.RowsPS)
	}
	s.Stats["baseline_copy_rows_per_s"] = benchkit.Of(base)
	if bp := s.Stats["baseline_copy_rows_per_s"].P50; bp > 0 {
		s.CopyRatio, s.DataRatio = s.Stats["mover_copy_rows_per_s"].P50/bp, s.Stats["copy_data_rows_per_s"].P50/bp
	}
	p := s.Stats["pause_ms"]
	s.PauseTargetMet = p.N > 0 && p.P99 <= pauseTarget && s.MovesAborted == 0
	var done []*topo.MoveRecord
	var small []float64
	for _, m := range s.Moves {
		if m.State == topo.MoveDone && m.rec != nil {
			done = append(done, m.rec)
			if m.Rows <= smallRows {
				small = append(small, m.rec.ElapsedMS())
			}
		}
	}
	s.Phases = migrate.SummarizePhases(done)
	s.SmallMoves = benchkit.Of(small)
}

// moveRow extracts a move's figures from its record.
func (b *bench) moveRow(rec *topo.MoveRecord) MoveRow {
	row := MoveRow{ID: rec.ID, Bucket: rec.Bucket, Level: rec.Level, From: rec.Source, To: rec.Target, State: rec.State, Rows: rec.Stats.RowsCopied,
		CopyMS: rec.Stats.CopyMS, LagMS: rec.Stats.LagAtFenceMS, PauseMS: rec.Stats.PauseMS, Error: rec.Error,
		VerifyOK: rec.Verify != nil && rec.Verify.OK && !rec.Verify.Inconclusive, RouterMS: -1, ClientMS: -1, startedAt: rec.CreatedAt,
		Phases: rec.Stats.Phases, rec: rec}
	if rec.Stats.CopyMS > 0 {
		row.RowsPS = float64(rec.Stats.RowsCopied) / rec.Stats.CopyMS * 1000
	}
	at := map[string]time.Time{}
	for _, st := range rec.Steps {
		at[st.State] = st.At // the last entry of a state wins
	}
	span := func(a, z string) float64 {
		if at[a].IsZero() || at[z].IsZero() {
			return 0
		}
		return benchkit.MS(at[z].Sub(at[a]))
	}
	// The flip's step ends with a ZooKeeper transaction that also writes
	// the record, so the record cannot time it: it is the rest of the
	// pause (the barrier step begins when the freeze commits).
	row.FenceMS, row.BarrierMS = span(topo.MoveFence, topo.MoveBarrier), span(topo.MoveBarrier, topo.MoveFlip)
	if rec.Stats.PauseMS > 0 && row.BarrierMS > 0 {
		row.FlipMS = max(rec.Stats.PauseMS-row.BarrierMS, 0)
	}
	row.TotalMS = span(topo.MovePrepare, topo.MoveDone)
	if row.VerifyMS = span(topo.MoveVerify, topo.MoveReversible); row.VerifyMS == 0 {
		row.VerifyMS = span(topo.MoveVerify, topo.MoveDone)
	}
	row.fenceAt, row.teardownAt = at[topo.MoveFence], at[topo.MoveTeardown]
	if b.trk != nil { // the router's moving window (RouterMS stays -1 when not seen)
		if w, ok := b.trk.find(bucketmap.Bucket{Prefix: rec.Bucket, Depth: rec.Level}, rec.CreatedAt); ok {
			row.RouterMS = benchkit.MS(w.end.Sub(w.start))
		}
	}
	if b.prb != nil {
		b.prb.copyPhases(&row, rec, at)
	}
	return row
}
