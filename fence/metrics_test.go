package fence

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardvisor/shardvisor/bucketmap"
)

// The reconciler's metrics: every outcome counted (each status exported
// at 0 from the start), one status per node at 1, a node the map no
// longer has forgotten; a nil *WatchMetrics records nothing.
func TestWatchMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewWatchMetrics(reg)
	if got := gather(t, reg); got[`shardvisor_fence_syncs_total{status="unreachable"}`] != 0 || len(got) != len(syncStatuses)+1 {
		t.Fatalf("at the start: %v", got)
	}
	m.synced(NodeSync{Node: "pg1", Status: SyncUnreachable})
	m.synced(NodeSync{Node: "pg2", Status: SyncInStep})
	m.synced(NodeSync{Node: "pg1", Status: SyncRepaired})
	m.following(7, func(id bucketmap.NodeID) bool { return id == "pg1" }, []bucketmap.NodeID{"pg1", "pg2"})
	got := gather(t, reg)
	for k, want := range map[string]float64{
		`shardvisor_fence_node_sync{node="pg1",status="repaired"}`:    1,
		`shardvisor_fence_node_sync{node="pg1",status="unreachable"}`: 0,
		`shardvisor_fence_syncs_total{status="unreachable"}`:          1,
		`shardvisor_fence_syncs_total{status="in-step"}`:              1,
		`shardvisor_fence_reconciler_map_version`:                     7,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (exported: %v), want %v", k, v, ok, want)
		}
	}
	for k := range got {
		if strings.Contains(k, `node="pg2"`) {
			t.Errorf("a node no longer synced is still exported: %s", k)
		}
	}
	var none *WatchMetrics
	none.synced(NodeSync{Node: "pg1", Status: SyncFailed})
	none.following(1, nil, nil)
}

// gather is reg's series, `name{labels}` → value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			k := mf.GetName()
			if len(labels) > 0 {
				k += "{" + strings.Join(labels, ",") + "}"
			}
			v := m.GetGauge().GetValue()
			if c := m.GetCounter(); c != nil {
				v = c.GetValue()
			}
			out[k] = v
		}
	}
	return out
}
