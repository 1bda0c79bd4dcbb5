package main

import (
	"strings"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/schema"
)

// Stat is a distribution's nearest-rank percentiles, in ms.
type Stat = benchkit.Stat

// Window is the writes that overlapped a span of time.
type Window struct {
	FromMS    float64 `json:"from_ms"` // since the variant's load started
	LengthMS  float64 `json:"length_ms"`
	Writes    int     `json:"writes"`
	Failed    int     `json:"failed"`
	LatencyMS Stat    `json:"latency_ms"`
}

// Variant is one schema change applied under the write load.
type Variant struct {
	Name        string  `json:"name"`
	ChangeID    string  `json:"change_id"`
	SQL         string  `json:"sql"`
	HoldNode    string  `json:"hold_node,omitempty"`
	HoldMS      float64 `json:"hold_ms,omitempty"`
	HoldError   string  `json:"hold_error,omitempty"`
	ApplyMS     float64 `json:"apply_ms"`
	ApplyError  string  `json:"apply_error,omitempty"`
	Canary      string  `json:"canary"`
	State       string  `json:"state"`
	Attempts    int     `json:"attempts"`
	LockTimeout int     `json:"lock_timeouts"`
	BlockedMax  float64 `json:"blocked_max_ms"`
	// Nodes is schema.Apply's per-node result.
	Nodes []schema.NodeResult `json:"nodes"`
	// ColumnOn counts the nodes where the new column is there afterwards.
	ColumnOn int `json:"column_on_nodes"`

	LoadSeconds  float64 `json:"load_seconds"`
	WritesPerSec float64 `json:"writes_per_s"`
	Writes       int     `json:"writes"`
	Failed       int     `json:"failed"`
	LastError    string  `json:"last_write_error,omitempty"`
	Baseline     Window  `json:"baseline_window"`
	During       Window  `json:"change_window"`
	// MaxRatio is the longest write during the change over the longest
	// write in the baseline window.
	MaxRatio float64 `json:"max_ratio_during_over_baseline"`
	GoalMet  bool    `json:"goal_met"`
}

// DiffRun is the diff part's figures.
type DiffRun struct {
	Tables       int       `json:"tables"`
	Nodes        int       `json:"nodes"`
	Runs         []float64 `json:"runs_ms"`
	MS           Stat      `json:"diff_ms"`
	MinMS        float64   `json:"diff_min_ms"`
	Differences  int       `json:"differences"`
	Unreachable  int       `json:"unreachable"`
	ElapsedMS    Stat      `json:"diff_elapsed_ms_own"`
	OneNodeMS    Stat      `json:"one_node_connect_read_ms"`
	OneNodeRead  Stat      `json:"one_node_read_ms"`
	OneNodeMinMS float64   `json:"one_node_connect_read_min_ms"`
	Ratio        float64   `json:"ratio_diff_over_one_node"`
	GoalMet      bool      `json:"goal_met"`
}

// Summary is everything the run found.
type Summary struct {
	Cores       int                      `json:"cores"`
	LoadAvg     string                   `json:"load_avg"`
	Level       int                      `json:"level"`
	Buckets     int                      `json:"buckets"`
	Nodes       int                      `json:"nodes"`
	Writers     int                      `json:"writers"`
	RowsLoaded  int64                    `json:"rows_loaded"`
	Database    string                   `json:"database"`
	ZKRoot      string                   `json:"zk_root"`
	Kept        bool                     `json:"kept"`
	Variants    []Variant                `json:"variants"`
	Diff        *DiffRun                 `json:"diff,omitempty"`
	GoalsMet    bool                     `json:"goals_met"`
	Error       string                   `json:"error,omitempty"`
	BucketCount map[bucketmap.NodeID]int `json:"bucket_counts"`
}

func report(s *Summary) {
	say("\nschema benchmark (issue 27): %d PostgreSQL nodes, level %d (%d buckets: %v), %d rows in app.kv, %d writers (closed loop), %d cores, load average %s",
		s.Nodes, s.Level, s.Buckets, s.BucketCount, s.RowsLoaded, s.Writers, s.Cores, s.LoadAvg)
	for _, v := range s.Variants {
		say("\n  %s: %s", v.Name, strings.TrimSpace(v.SQL))
		if v.HoldNode != "" {
			say("    long transaction on %s: row lock held %.0f ms (BEGIN; UPDATE one row; pg_sleep; COMMIT)%s", v.HoldNode, v.HoldMS, optErr(v.HoldError))
		}
		say("    schema.Apply:    %.1f ms, state %s, canary %s; attempts %d, lock timeouts %d, blocked at most %.1f ms (the change's record)%s",
			v.ApplyMS, v.State, v.Canary, v.Attempts, v.LockTimeout, v.BlockedMax, optErr(v.ApplyError))
		for _, n := range v.Nodes {
			say("      %-4s %-8s attempts %2d  lock timeouts %2d  longest attempt %7.1f ms  app statements seen waiting %7.1f ms  waiting for blockers %7.1f ms  ran %v%s",
				n.Node, n.State, n.Attempts, n.LockTimeouts, n.BlockedMaxMS, n.AppWaitMaxMS, n.BlockerWaitMS, n.Ran, optErr(n.Error))
		}
		say("    column on nodes: %d/%d", v.ColumnOn, s.Nodes)
		say("    write load:      %d writes in %.1f s (%.0f writes/s), %d failed (goal 0)%s", v.Writes, v.LoadSeconds, v.WritesPerSec, v.Failed, optErr(v.LastError))
		say("    baseline window  (%6.0f ms before the change, no change): %s, %d failed", v.Baseline.LengthMS, v.Baseline.LatencyMS.MS(), v.Baseline.Failed)
		say("    change window    (%6.0f ms from the apply's start):       %s, %d failed", v.During.LengthMS, v.During.LatencyMS.MS(), v.During.Failed)
		if v.Baseline.LengthMS > 0 && v.During.LengthMS > 0 && v.Baseline.LatencyMS.N > 0 {
			before := float64(v.Baseline.LatencyMS.N) / v.Baseline.LengthMS * 1000
			during := float64(v.During.LatencyMS.N) / v.During.LengthMS * 1000
			say("    throughput:      %.0f writes/s in the change window vs %.0f before: %s", during, before, benchkit.RatioX(during, before))
		}
		say("    longest write: %.1f ms during the change vs %.1f ms before: %s; goal failed = 0 and longest write < %.0f ms: %s",
			v.During.LatencyMS.Max, v.Baseline.LatencyMS.Max, benchkit.RatioX(v.During.LatencyMS.Max, v.Baseline.LatencyMS.Max), waitGoalMS, benchkit.Verdict(v.GoalMet))
	}
	if d := s.Diff; d != nil {
		say("\n  schema diff: %d sharded tables on %d nodes, %d runs of schema.Diff (connect + read every node at once + compare)", d.Tables, d.Nodes, len(d.Runs))
		say("    schema.Diff:       min %7.1f  median %7.1f  max %7.1f ms   (its own elapsed_ms: median %.1f)   goal < %.0f ms: %s",
			d.MinMS, d.MS.P50, d.MS.Max, d.ElapsedMS.P50, diffGoalMS, benchkit.Verdict(d.GoalMet))
		say("    one node:          connect + fence.ReadSchemas median %7.1f ms (min %.1f); ReadSchemas alone median %.1f ms", d.OneNodeMS.P50, d.OneNodeMinMS, d.OneNodeRead.P50)
		say("    ratio diff / one node (medians): %s; differences found %d, unreachable %d", benchkit.RatioX(d.MS.P50, d.OneNodeMS.P50), d.Differences, d.Unreachable)
	}
	say("\n  goals: %s", benchkit.Verdict(s.GoalsMet))
	if s.Kept {
		say("  kept: database %s on every node, ZooKeeper %s", s.Database, s.ZKRoot)
	}
	if s.Error != "" {
		say("  ERROR: %s", s.Error)
	}
}

func optErr(e string) string {
	if e == "" {
		return ""
	}
	return "; error: " + e
}
