package migrate

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// A running `rebalance --watch` never changes what it plans because of
// another command without saying so: it names the mode when elected, and
// when another rebalancer sets the mode it logs the old mode, the new,
// who set it and the command back. Pause and resume keep who set it; a
// record of an older build saying "bytes" reads as size.
func TestWatcherLogsBalanceModeChange(t *testing.T) {
	t.Parallel()
	c := newMemCluster(t, 1, 2, kvTable)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	var said []string
	saw := func(subs ...string) bool {
		mu.Lock()
		defer mu.Unlock()
	next:
		for _, s := range said {
			for _, sub := range subs {
				if !strings.Contains(s, sub) {
					continue next
				}
			}
			return true
		}
		return false
	}
	w := NewRebalancer(New(c.st, Options{}), bucketmap.Policy{})
	w.Progress = func(p Progress) {
		mu.Lock()
		said = append(said, p.Message)
		mu.Unlock()
	}
	done := make(chan error, 1)
	go func() { done <- w.RunForever(ctx) }()
	testenv.WaitFor(t, 10*time.Second, func() bool { return saw("the cluster balances by count", "plans moves by bucket count") }, "the mode at election")

	other := NewRebalancer(New(c.st, Options{}), bucketmap.Policy{})
	if old, err := other.SetBalanceMode(ctx, "size", "shardctl rebalance mode size (ops@host1)"); err != nil || old != "count" {
		t.Fatalf("set size: was %q, %v", old, err)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool {
		return saw("balance mode changed from count to size", "set by shardctl rebalance mode size (ops@host1) at", "plans none by count", "shardctl rebalance mode count")
	}, "the watcher's line on the change")

	// Pause and resume keep the mode and who set it.
	if err := other.Pause(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	if err := other.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := other.State(ctx)
	if err != nil || rec.Mode() != "size" || rec.BySetBy != "shardctl rebalance mode size (ops@host1)" || rec.BySetAt == nil || rec.Paused {
		t.Fatalf("after pause and resume: %+v %v", rec, err)
	}
	// A plain rebalance by count is refused, naming the commands.
	if _, err := other.Run(ctx); !errors.Is(err, ErrBalanceMode) || !strings.Contains(err.Error(), "balances by size") {
		t.Fatalf("run by count of a cluster by size: %v", err)
	}

	// An older build's record: "bytes" is size, and the watcher sees no
	// change in it.
	old := topo.RebalanceRecord{Version: topo.RebalanceVersion, At: time.Now().UTC(), By: "bytes"}
	if err := topo.WriteRebalance(ctx, c.s, c.st.Paths(), old); err != nil {
		t.Fatal(err)
	}
	if by, err := other.BalanceMode(ctx); err != nil || by != "size" {
		t.Fatalf("mode of a record saying bytes: %q %v", by, err)
	}
	if _, err := other.SetBalanceMode(ctx, "count", "test"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool {
		return saw("balance mode changed from size to count", "set by test at", "plans moves by bucket count")
	}, "the change back")
	if saw("from size to size") {
		t.Fatalf("the watcher took bytes for a change: %q", said)
	}
	if _, err := other.SetBalanceMode(ctx, "bytes-ish", "test"); err == nil || !strings.Contains(err.Error(), "count, size or rows") {
		t.Fatalf("a bad mode: %v", err)
	}
	cancel()
	if err := testenv.Receive(t, done, 10*time.Second, "RunForever after its context ended"); !errors.Is(err, context.Canceled) && !errors.Is(err, zksession.ErrClosed) {
		t.Fatalf("RunForever: %v", err)
	}
}
