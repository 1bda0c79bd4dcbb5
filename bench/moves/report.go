package main

import (
	"fmt"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/topo"
)

// Stat is a distribution's nearest-rank percentiles, in ms (or rows/s).
type Stat = benchkit.Stat

func stat(xs []float64) Stat { return benchkit.Of(xs) }

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
	startedAt  time.Time
	fenceAt    time.Time
	teardownAt time.Time
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
	Cores         int            `json:"cores"`
	Level         int            `json:"level"`
	Buckets       int            `json:"buckets"`
	RowsPerBucket int            `json:"rows_per_bucket"`
	RowsLoaded    int64          `json:"rows_loaded"`
	LoadSeconds   float64        `json:"load_seconds"`
	Writers       int            `json:"writers"`
	Rate          int            `json:"rate"`
	Concurrency   int            `json:"concurrency"`
	Database      string         `json:"database"`
	ZKRoot        string         `json:"zk_root"`
	Kept          bool           `json:"kept"`
	RebalanceSecs float64        `json:"rebalance_seconds"`
	Balanced      bool           `json:"balanced"`
	Restarts      int            `json:"rebalancer_restarts"`
	FinalCounts   map[string]int `json:"final_bucket_counts"`
	Moves         []MoveRow      `json:"moves"`
	MovesDone     int            `json:"moves_done"`
	MovesAborted  int            `json:"moves_aborted"`
	VerifyOK      int            `json:"verify_ok"`
	RowsMoved     int64          `json:"rows_moved"`
	PauseMS       Stat           `json:"pause_ms"`
	FenceStepMS   Stat           `json:"fence_step_ms"`
	BarrierStepMS Stat           `json:"barrier_step_ms"`
	FlipStepMS    Stat           `json:"flip_step_ms"`
	LagAtFenceMS  Stat           `json:"lag_at_fence_ms"`
	RouterPauseMS Stat           `json:"router_pause_ms"`
	ClientStallMS Stat           `json:"client_stall_ms"`
	MoveTotalMS   Stat           `json:"move_total_ms"`
	CopyMS        Stat           `json:"copy_ms"`
	MoverRowsPS   Stat           `json:"mover_copy_rows_per_s"`
	Baseline      []BaselineRun  `json:"baseline"`
	// Rollbacks: moves made with a rollback window after the rebalance,
	// each rolled back at once under the same load; their rollback moves'
	// write pauses (issue 25's goal: p99 under 50 ms).
	Rollbacks       []MoveRow `json:"rollbacks,omitempty"`
	RollbackPauseMS Stat      `json:"rollback_pause_ms"`
	BaselineRowsPS  Stat      `json:"baseline_copy_rows_per_s"`
	CopyRatio       float64   `json:"copy_ratio_mover_over_baseline"`
	SlotMS          Stat      `json:"copy_slot_ms"`
	LaunchMS        Stat      `json:"copy_apply_worker_ms"`
	StartMS         Stat      `json:"copy_start_ms"`
	DataMS          Stat      `json:"copy_data_ms"`
	HandoverMS      Stat      `json:"copy_handover_ms"`
	DataRowsPS      Stat      `json:"copy_data_rows_per_s"`
	DataRatio       float64   `json:"copy_data_ratio_over_baseline"`
	PGProbeMS       Stat      `json:"pg_probe_ms"`
	ZKReadMS        Stat      `json:"zk_read_ms"`
	ZKWriteMS       Stat      `json:"zk_write_ms"`
	PGConnectMS     Stat      `json:"pg_connect_ms"`
	PauseTargetMet  bool      `json:"pause_target_met"`

	WritesPerSecBefore float64 `json:"writes_per_s_before"`
	WritesPerSecDuring float64 `json:"writes_per_s_during_moves"`
	WritesAcked        int64   `json:"writes_acknowledged"`
	WritesFailed       int64   `json:"writes_failed"`
	WritesGaveUp       int64   `json:"writes_gave_up"`
	LastWriteError     string  `json:"last_write_error,omitempty"`
	WriteLatencyMS     Stat    `json:"write_latency_ms"`

	UsersChecked   int      `json:"users_checked"`
	Missing        int      `json:"missing_acknowledged_writes"`
	MissingSamples []string `json:"missing_samples,omitempty"`
	NewerThanAcked int      `json:"newer_than_acknowledged"`
	Leftovers      []string `json:"leftovers,omitempty"`
	Error          string   `json:"error,omitempty"`

	// Big is the big-bucket mode's (--big-rows) result; nil otherwise.
	Big *BigRun `json:"big,omitempty"`
}

const pauseTarget = 100.0 // ms, p99

func report(s *Summary) {
	if s.Big != nil {
		reportBig(s)
		return
	}
	ms := Stat.MS
	say("")
	say("move benchmark (issue 7): %d -> %d PostgreSQL nodes, level %d (%d buckets), %d rows/bucket (%s rows loaded in %.0f s), %d writers%s, concurrency %d, %d cores",
		startNodes, startNodes+1, s.Level, s.Buckets, s.RowsPerBucket, human(float64(s.RowsLoaded)), s.LoadSeconds, s.Writers,
		map[bool]string{true: fmt.Sprintf(" at %d writes/s", s.Rate), false: " (closed loop)"}[s.Rate > 0], s.Concurrency, s.Cores)
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
	verdict := "NOT MET"
	if s.PauseTargetMet {
		verdict = "met"
	}
	say("  write pause per move (mover record: source frozen -> map flipped, ZooKeeper CAS included)")
	say("                    %s   target p99 < %.0f ms: %s", ms(s.PauseMS), pauseTarget, verdict)
	say("    steps:  fence (map moving, routers caught up, freeze)  %s", ms(s.FenceStepMS))
	say("            barrier (marker applied on target, snapshot)    %s", ms(s.BarrierStepMS))
	say("            flip (map + move record: one ZooKeeper CAS)     %s", ms(s.FlipStepMS))
	say("  moving window as the router saw it (map says moving -> map flipped; writes go on to the source until its freeze)")
	say("                    %s", ms(s.RouterPauseMS))
	say("  longest client write to the bucket that began while it was moving (router.Do: fence rejections and retries included;")
	say("  for information: it also holds the write load's own latency tail, see below)")
	say("                    %s", ms(s.ClientStallMS))
	say("  replication lag at fence: %s", ms(s.LagAtFenceMS))
	say("  move duration:    %s", ms(s.MoveTotalMS))
	ratio := "n/a"
	if s.CopyRatio > 0 {
		ratio = fmt.Sprintf("%.2f", s.CopyRatio)
	}
	say("  copy throughput:  mover median %s rows/s (copy step median %.0f ms), plain COPY pipe median %s rows/s (%d buckets, same nodes, under the same load)",
		human(s.MoverRowsPS.P50), s.CopyMS.P50, human(s.BaselineRowsPS.P50), len(s.Baseline))
	say("                    ratio mover/baseline: %s", ratio)
	if s.DataRowsPS.N > 0 {
		say("    where the copy step goes (the nodes' activity, probed every %s):", probeEvery)
		say("            step start -> the move's slot created  %s", ms(s.SlotMS))
		say("            step start -> its COPYs start          %s", ms(s.StartMS))
		say("            the COPYs (source sends .. target done) %s", ms(s.DataMS))
		say("            COPY end -> end of the copy step       %s", ms(s.HandoverMS))
		say("            step start -> apply worker streaming   %s (enabled once the COPYs committed)", ms(s.LaunchMS))
		say("            the COPYs alone: median %s rows/s, ratio to the baseline %.2f", human(s.DataRowsPS.P50), s.DataRatio)
	}
	say("  during the moves: PostgreSQL probe query %s", ms(s.PGProbeMS))
	say("                    PostgreSQL new conn.   %s", ms(s.PGConnectMS))
	say("                    ZooKeeper map read     %s", ms(s.ZKReadMS))
	say("                    ZooKeeper write        %s", ms(s.ZKWriteMS))
	say("  write load:       %.0f writes/s before, %.0f writes/s during the moves; %d acknowledged, %d failed (%d gave up after router.Do's retries)",
		s.WritesPerSecBefore, s.WritesPerSecDuring, s.WritesAcked, s.WritesFailed, s.WritesGaveUp)
	say("                    write latency %s", ms(s.WriteLatencyMS))
	if s.LastWriteError != "" {
		say("                    last write error: %s", s.LastWriteError)
	}
	if s.RollbackPauseMS.N > 0 {
		say("  rollbacks:        %d moves rolled back under the load: write pause %s (goal: p99 under 50 ms)", s.RollbackPauseMS.N, ms(s.RollbackPauseMS))
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

func seen(ms float64) string {
	if ms < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", ms)
}

func optMS(d time.Duration, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
}

func (b *bench) summarize(s *Summary) {
	var pause, fenceS, barrierS, flipS, lag, routerP, client, total, copyMS, rps, base []float64
	var slot, launch, start, data, handover, dataRPS []float64
	add := func(xs *[]float64, x float64) {
		if x >= 0 {
			*xs = append(*xs, x)
		}
	}
	for _, m := range s.Moves {
		switch m.State {
		case topo.MoveDone:
			s.MovesDone++
		case topo.MoveAborted:
			s.MovesAborted++
		}
		if m.VerifyOK {
			s.VerifyOK++
		}
		if m.State != topo.MoveDone {
			continue
		}
		s.RowsMoved += m.Rows
		pause = append(pause, m.PauseMS)
		fenceS = append(fenceS, m.FenceMS)
		barrierS = append(barrierS, m.BarrierMS)
		flipS = append(flipS, m.FlipMS)
		lag = append(lag, m.LagMS)
		total = append(total, m.TotalMS)
		copyMS = append(copyMS, m.CopyMS)
		rps = append(rps, m.RowsPS)
		add(&routerP, m.RouterMS)
		add(&client, m.ClientMS)
		add(&slot, m.SlotMS)
		add(&launch, m.LaunchMS)
		add(&start, m.StartMS)
		add(&data, m.DataMS)
		add(&handover, m.HandoverMS)
		if m.DataRowsPS > 0 {
			dataRPS = append(dataRPS, m.DataRowsPS)
		}
	}
	for _, r := range s.Baseline {
		base = append(base, r.RowsPS)
	}
	s.PauseMS, s.FenceStepMS, s.BarrierStepMS, s.FlipStepMS = stat(pause), stat(fenceS), stat(barrierS), stat(flipS)
	s.LagAtFenceMS, s.RouterPauseMS, s.ClientStallMS, s.MoveTotalMS = stat(lag), stat(routerP), stat(client), stat(total)
	s.CopyMS, s.MoverRowsPS, s.BaselineRowsPS = stat(copyMS), stat(rps), stat(base)
	s.SlotMS, s.LaunchMS, s.StartMS, s.DataMS, s.HandoverMS, s.DataRowsPS = stat(slot), stat(launch), stat(start), stat(data), stat(handover), stat(dataRPS)
	if s.BaselineRowsPS.P50 > 0 {
		s.CopyRatio = s.MoverRowsPS.P50 / s.BaselineRowsPS.P50
		s.DataRatio = s.DataRowsPS.P50 / s.BaselineRowsPS.P50
	}
	s.PauseTargetMet = s.PauseMS.N > 0 && s.PauseMS.P99 < pauseTarget && s.MovesAborted == 0
}

// moveRow extracts a move's figures from its record.
func (b *bench) moveRow(rec *topo.MoveRecord) MoveRow {
	row := MoveRow{ID: rec.ID, Bucket: rec.Bucket, Level: rec.Level, From: rec.Source, To: rec.Target, State: rec.State, Rows: rec.Stats.RowsCopied,
		CopyMS: rec.Stats.CopyMS, LagMS: rec.Stats.LagAtFenceMS, PauseMS: rec.Stats.PauseMS, Error: rec.Error,
		VerifyOK: rec.Verify != nil && rec.Verify.OK && !rec.Verify.Inconclusive, RouterMS: -1, ClientMS: -1, startedAt: rec.CreatedAt}
	if rec.Stats.CopyMS > 0 {
		row.RowsPS = float64(rec.Stats.RowsCopied) / rec.Stats.CopyMS * 1000
	}
	at := map[string]time.Time{}
	for _, st := range rec.Steps {
		at[st.State] = st.At // the last entry of a state wins
	}
	span := func(a, z string) float64 {
		ta, okA := at[a]
		tz, okZ := at[z]
		if !okA || !okZ {
			return 0
		}
		return float64(tz.Sub(ta).Microseconds()) / 1000
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
	if b.trk != nil {
		if d, ok := b.trk.pause(bucketmap.Bucket{Prefix: rec.Bucket, Depth: rec.Level}, rec.CreatedAt); ok {
			row.RouterMS = float64(d.Microseconds()) / 1000
		}
	}
	if b.prb != nil {
		b.prb.copyPhases(&row, rec)
	}
	return row
}
