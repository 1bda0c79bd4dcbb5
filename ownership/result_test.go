package ownership

import (
	"errors"
	"reflect"
	"testing"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
)

// The warnings are exactly what shardctl printed after a map change
// before package ownership (after "shardctl: warning: "): fences in step,
// repaired or already newer are not drift.
func TestResultWarnings(t *testing.T) {
	m := &bucketmap.Map{Version: 7}
	res := &Result{Map: m, Fences: []fence.NodeSync{
		{Node: "a", Status: fence.SyncInStep},
		{Node: "b", Status: fence.SyncRepaired},
		{Node: "c", Status: fence.SyncStale, Detail: "newer"},
		{Node: "d", Status: fence.SyncNotInstalled, Detail: "no fence"},
		{Node: "e", Status: fence.SyncUnreachable, Detail: "connection refused"},
		{Node: "f", Status: fence.SyncFailed, Detail: "boom"},
	}}
	want := []string{
		"fence drift: node d has no fence installed, so writes to it are not fenced; run `shardctl node prepare d`",
		"fence drift: node e was not brought to map version 7 (unreachable: connection refused); its fence keeps its previous ownership until `shardctl node reconcile` succeeds",
		"fence drift: node f was not brought to map version 7 (failed: boom); its fence keeps its previous ownership until `shardctl node reconcile` succeeds",
	}
	if got := res.Warnings(); !reflect.DeepEqual(got, want) {
		t.Errorf("warnings:\n%q\nwant\n%q", got, want)
	}
	if d := res.Drift(); len(d) != 3 || d[0].Node != "d" || d[1].Node != "e" || d[2].Node != "f" {
		t.Errorf("drift %+v", d)
	}
	res = &Result{Map: m, FenceErr: errors.New("no cluster record")}
	want = []string{"fence drift: cannot read the cluster record to update the db nodes' fences to map version 7: no cluster record; run `shardctl node reconcile`"}
	if got := res.Warnings(); !reflect.DeepEqual(got, want) {
		t.Errorf("warnings:\n%q\nwant\n%q", got, want)
	}
	if d := res.Drift(); len(d) != 1 || d[0].Node != "" {
		t.Errorf("drift with no cluster record: %+v", d)
	}
	if w := (&Result{Map: m}).Warnings(); len(w) != 0 {
		t.Errorf("no sharded tables: warnings %q", w)
	}
}
