package migrate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
)

// A move whose source group would drop its slot (no ignore_slots for
// logical slots), or whose target group is not in synchronous mode, is
// refused before anything is created, naming the node and the fix.
func TestMovesRefuseGroupsThatWouldBreakThem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, s := zktest.NewMemoryTree(t)
	setConfig := func(scope, cfg string) { zktest.Put(t, s, "/service/"+scope+"/config", cfg) }
	good := `{"ttl":10,"synchronous_mode":true,"ignore_slots":[{"type":"logical","plugin":"pgoutput"}]}`
	group := func(scope string) bucketmap.Node {
		return bucketmap.Node{ID: bucketmap.NodeID(scope), DSN: "postgres://a@h1:1,h2:2/db?target_session_attrs=read-write", Weight: 1, State: bucketmap.NodeActive,
			Patroni: bucketmap.Patroni{Namespace: "/service/", Scope: scope}}
	}
	plain := bucketmap.Node{ID: "p1", DSN: "postgres://a@h/db", Weight: 1, State: bucketmap.NodeActive}
	r := &run{mv: &Mover{s: s}, rec: &topo.MoveRecord{Source: "src", Target: "dst"}}
	for _, tc := range []struct {
		name     string
		src, dst bucketmap.Node
		srcCfg   string
		dstCfg   string
		errHas   string
	}{
		{"plain nodes", plain, plain, "", "", ""},
		{"whole groups", group("src"), group("dst"), good, good, ""},
		{"source drops slots", group("src"), plain, `{"synchronous_mode":true}`, "", "source src is a Patroni group whose ignore_slots"},
		{"source keeps only one slot", group("src"), plain, `{"synchronous_mode":true,"ignore_slots":[{"name":"x","type":"logical"}]}`, "", "ignore_slots"},
		{"target async", plain, group("dst"), "", `{"synchronous_mode":false,"ignore_slots":[{"type":"logical"}]}`, "target dst is a Patroni group not in synchronous_mode"},
		{"target records missing", plain, group("nope"), "", "", "no Patroni records"},
	} {
		if tc.srcCfg != "" {
			setConfig("src", tc.srcCfg)
		}
		if tc.dstCfg != "" {
			setConfig("dst", tc.dstCfg)
		}
		r.src, r.dst = tc.src, tc.dst
		err := r.checkGroups(ctx)
		if tc.errHas == "" && err != nil || tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.errHas)
		}
	}
}
