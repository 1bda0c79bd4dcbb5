package topo

import (
	"errors"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/zksession"
)

// A probe is published under its move, never creating the move; an older
// probe never replaces a newer one (two watchers at a lock handover).
func TestWriteReverseStateKeepsTheNewest(t *testing.T) {
	ctx, _, s, p := zkCluster(t)
	clusterNode(t, ctx, s, p)
	now := time.Now().UTC()
	if err := WriteReverseState(ctx, s, p, "m1", ReverseState{State: "running", At: now}); !errors.Is(err, zksession.ErrNoNode) {
		t.Fatalf("a probe of a move with no record: %v, want ErrNoNode", err)
	}
	if err := CreateMove(ctx, s, p, &MoveRecord{Version: MoveVersion, ID: "m1", State: MoveReversible}); err != nil {
		t.Fatal(err)
	}
	if st, err := ReadReverseState(ctx, s, p, "m1"); st != nil || err != nil {
		t.Fatalf("before any probe: %+v, %v", st, err)
	}
	lag := int64(10)
	if err := WriteReverseState(ctx, s, p, "m1", ReverseState{State: "running", LagBytes: &lag, At: now}); err != nil {
		t.Fatal(err)
	}
	if err := WriteReverseState(ctx, s, p, "m1", ReverseState{State: "lost", Reason: "gone", At: now.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	if err := WriteReverseState(ctx, s, p, "m1", ReverseState{State: "running", At: now.Add(500 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	st, err := ReadReverseState(ctx, s, p, "m1")
	if err != nil || st.State != "lost" || st.Reason != "gone" || st.Version != ReverseStateVersion {
		t.Fatalf("after an older probe came last: %+v, %v; want the newer (lost)", st, err)
	}
	ids, err := ListMoves(ctx, s, p)
	if err != nil || len(ids) != 1 || ids[0] != "m1" {
		t.Fatalf("moves listed with a published probe: %v, %v", ids, err)
	}
}
