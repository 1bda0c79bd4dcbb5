package main

import (
	"strings"

	"github.com/shardvisor/shardvisor/internal/benchkit"
)

// Change is one map change.
type Change struct {
	N           int     `json:"n"`
	Encoding    string  `json:"encoding"`
	Kind        string  `json:"kind"` // moving or flip
	Bucket      uint32  `json:"bucket"`
	MapVersion  uint64  `json:"map_version"`
	RecordBytes int     `json:"record_bytes"` // the znode's data
	WireBytes   int64   `json:"wire_bytes"`   // read by all watchers' connections
	WriteMS     float64 `json:"write_ms"`     // the compare-and-swap, encoding included
	AllMS       float64 `json:"all_applied_ms"`
	AllStartMS  float64 `json:"all_applied_from_write_start_ms"`
	P50MS       float64 `json:"watcher_p50_ms"`
	Early       int     `json:"applied_before_write_returned"`
	WindowMS    float64 `json:"window_ms"`
}

// Side is one encoding's figures.
type Side struct {
	Encoding     string        `json:"encoding"`
	RecordBytes  int           `json:"record_bytes"`
	PlainBytes   int           `json:"plain_json_bytes"`
	EncodeMS     float64       `json:"encode_ms"`        // Encode of the map, one writer
	DecodeMS     float64       `json:"decode_ms"`        // DecodeRecord, one watcher, one goroutine
	BytesPerChg  float64       `json:"bytes_per_change"` // median over changes
	PerWatcher   float64       `json:"bytes_per_watcher_per_change"`
	WatcherMS    benchkit.Stat `json:"watcher_apply_ms"` // every watcher of every change
	AllAppliedMS benchkit.Stat `json:"all_applied_ms"`   // per change: until the last watcher
	FromStartMS  benchkit.Stat `json:"all_applied_from_write_start_ms"`
	WriteMS      benchkit.Stat `json:"write_ms"`
	Early        int           `json:"applied_before_write_returned"`
	TargetMet    bool          `json:"target_met"`
	TargetMetAll bool          `json:"target_met_from_write_start"`
}

// Summary is everything the run found.
type Summary struct {
	Cores          int      `json:"cores"`
	Level          int      `json:"level"`
	Buckets        int      `json:"buckets"`
	Nodes          int      `json:"nodes"`
	Layout         string   `json:"layout"`
	Watchers       int      `json:"watchers"`
	Members        bool     `json:"members"`
	ChangesPerEnc  int      `json:"changes_per_encoding"`
	ZKRoot         string   `json:"zk_root"`
	IdleBytesPerS  float64  `json:"idle_wire_bytes_per_s"`
	ConnectSeconds float64  `json:"connect_seconds"`
	LoadAvg        []string `json:"load_average_start_end"`
	LockSeconds    float64  `json:"lock_wait_seconds"`
	Sides          []*Side  `json:"encodings"`
	Changes        []Change `json:"changes"`
	Error          string   `json:"error,omitempty"`
}

// summarize fills each encoding's figures from the changes done so far
// (all of them, or those before an error).
func summarize(sum *Summary, perWatcher map[string][]float64) {
	for _, side := range sum.Sides {
		var bytes, all, fromStart, write []float64
		for _, c := range sum.Changes {
			if c.Encoding != side.Encoding {
				continue
			}
			bytes, all = append(bytes, float64(c.WireBytes)), append(all, c.AllMS)
			fromStart, write = append(fromStart, c.AllStartMS), append(write, c.WriteMS)
			side.Early += c.Early
		}
		side.BytesPerChg = benchkit.Of(bytes).P50
		side.PerWatcher = side.BytesPerChg / float64(*watchers)
		side.AllAppliedMS, side.FromStartMS, side.WriteMS = benchkit.Of(all), benchkit.Of(fromStart), benchkit.Of(write)
		side.WatcherMS = benchkit.Of(perWatcher[side.Encoding])
		side.TargetMet = side.AllAppliedMS.N > 0 && side.AllAppliedMS.P99 <= target
		side.TargetMetAll = side.FromStartMS.N > 0 && side.FromStartMS.P99 <= target
	}
}

func report(s *Summary) {
	out.Say("\nmap propagation benchmark: level %d (%d buckets), %d nodes (layout %s), %d watchers on their own sessions in one process (member records: %v), %d changes per encoding (moves alternating between encodings), %d cores",
		s.Level, s.Buckets, s.Nodes, s.Layout, s.Watchers, s.Members, s.ChangesPerEnc, s.Cores)
	out.Say("  load average (1 min) at the start and the end of the changes: %s", strings.Join(s.LoadAvg, ", "))
	out.Say("  idle: the fleet reads %.0f B/s from ZooKeeper when nothing changes (heartbeats, pings); included below", s.IdleBytesPerS)
	for _, side := range s.Sides {
		out.Say("  %s: record %d B (plain JSON %d B); one encode %.2f ms, one decode %.2f ms (one goroutine, before the watchers start)",
			side.Encoding, side.RecordBytes, side.PlainBytes, side.EncodeMS, side.DecodeMS)
		out.Say("      ZooKeeper bytes read per change, all watchers (wire, median): %.0f B (%.0f B per watcher)", side.BytesPerChg, side.PerWatcher)
		out.Say("      every watcher applied, per change, from the write's return: %s   target p99 <= %.0f ms: %s", side.AllAppliedMS.MS(), target, benchkit.Verdict(side.TargetMet))
		out.Say("                              the same from the write's start: %s   target p99 <= %.0f ms: %s", side.FromStartMS.MS(), target, benchkit.Verdict(side.TargetMetAll))
		out.Say("      each watcher's apply, from the write's return:               %s", side.WatcherMS.MS())
		out.Say("      the write (CAS, encode included):                            %s", side.WriteMS.MS())
		if side.Early > 0 {
			out.Say("      (%d applies came before the write returned; counted as 0 ms)", side.Early)
		}
	}
	for i := 1; i < len(s.Sides); i++ {
		base, side := s.Sides[0], s.Sides[i]
		out.Say("  %s against %s (baseline), same run:", side.Encoding, base.Encoding)
		cmp := func(what, f string, x, b float64) {
			out.Say("    %s: "+f+" (baseline "+f+", ratio %.3f×)", what, x, b, benchkit.Ratio(x, b))
		}
		cmp("bytes per change", "%.0f", side.BytesPerChg, base.BytesPerChg)
		cmp("every watcher applied, p99", "%.1f ms", side.AllAppliedMS.P99, base.AllAppliedMS.P99)
		cmp("every watcher applied, p50", "%.1f ms", side.AllAppliedMS.P50, base.AllAppliedMS.P50)
		cmp("each watcher's apply, p50", "%.1f ms", side.WatcherMS.P50, base.WatcherMS.P50)
		cmp("decode CPU per watcher", "%.2f ms", side.DecodeMS, base.DecodeMS)
		cmp("encode CPU per write", "%.2f ms", side.EncodeMS, base.EncodeMS)
	}
	if s.Error != "" {
		out.Say("  ERROR: %s", s.Error)
	}
}
