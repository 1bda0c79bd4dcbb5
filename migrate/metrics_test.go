package migrate

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The mover's counters exist at 0 from the start (an alert on increase()
// sees the first straggler and the first resume), with every label value
// the mover uses.
func TestMetricsExportedAtZero(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	NewMetrics(reg)
	for _, kind := range []string{"router", "supervisor"} {
		for _, action := range []string{StragglerProceed, StragglerAbort} {
			if n := gathered(t, reg, "shardvisor_move_stragglers_total", map[string]string{"kind": kind, "action": action}); n != 0 {
				t.Errorf("stragglers %s %s: %v", kind, action, n)
			}
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, mf := range mfs {
		series[mf.GetName()] = len(mf.GetMetric())
	}
	if series["shardvisor_move_stragglers_total"] != 4 || series["shardvisor_move_orphan_resumes_total"] != 4 ||
		series["shardvisor_move_reverse_lost_total"] != 1 || series["shardvisor_move_frozen_bucket_oldest_seconds"] != 1 {
		t.Fatalf("series at the start: %v", series)
	}
}
