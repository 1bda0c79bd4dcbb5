package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// `shardctl move` that lost its runner lock while an orphan watcher rolled
// the move back finds the move aborted when ZooKeeper answers again: Move
// must not report success.
func TestAfterLockLossOnAbortedMove(t *testing.T) {
	c := newMemCluster(t, 1, 2, kvTable)
	c.record(t, "mv-1", 0, topo.MoveAborted, func(r *topo.MoveRecord) { r.Error = "rolled back by the watcher" })
	mv := New(c.st, Options{})
	rec, err := mv.afterLockLoss(context.Background(), "mv-1", fmt.Errorf("move stopped: %w", zksession.ErrLockLost))
	t.Logf("afterLockLoss: state %s, err %v", rec.State, err)
	if err == nil || rec.State != topo.MoveAborted || !strings.Contains(err.Error(), "rolled back by the watcher") {
		t.Errorf("a move that the watcher aborted is returned as a success: %s, err nil", rec.State)
	}
}

// A record that does not exist is no reason to wait for ZooKeeper.
func TestAfterLockLossOnMissingRecord(t *testing.T) {
	c := newMemCluster(t, 1, 2, kvTable)
	mv := New(c.st, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	start := time.Now()
	rec, err := mv.afterLockLoss(ctx, "no-such-move", fmt.Errorf("x: %w", zksession.ErrLockLost))
	t.Logf("after %s: %v %v", time.Since(start).Round(time.Millisecond), rec, err)
	if time.Since(start) > 3*time.Second || err == nil || !errors.Is(err, zksession.ErrNoNode) {
		t.Errorf("afterLockLoss on a record that does not exist: %v after %s (it must not wait for ctx)", err, time.Since(start))
	}
}
