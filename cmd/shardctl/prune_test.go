package main

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
)

// The watcher prunes its own scheduled points and the points taken before
// changes, each down to the newest --keep, and nothing else: not a manual
// point, nor the points of a watcher whose prefix begins with its own.
func TestPrunePoints(t *testing.T) {
	z, s := zktest.NewMemoryTree(t)
	ctx := context.Background()
	p := topo.MustPaths(z.Root, "c1")
	if err := s.CreateAll(ctx, p.Cluster()); err != nil {
		t.Fatal(err)
	}
	st := bucketmap.NewStore(s, p)
	t0 := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	mk := func(name, reason string, k int) {
		rp := &topo.RestorePoint{Version: 1, Name: name, WALName: name + "@x", At: t0.Add(time.Duration(k) * time.Minute), Reason: reason,
			Nodes: map[string]topo.PointNode{"pg1": {LSN: "0/1"}}}
		if err := topo.CreateRestorePoint(ctx, s, p, rp, []byte("m")); err != nil {
			t.Fatal(err)
		}
	}
	for k := range 4 {
		ts := t0.Add(time.Duration(k) * time.Minute).Format("20060102t150405")
		mk("auto-"+ts, "schedule", k)
		mk("auto-x-"+ts, "schedule", k)
		mk(fmt.Sprintf("before-rebalance-%d", k), "before rebalance", k)
	}
	mk("by-hand", "manual", 0)
	if err := prunePoints(ctx, st, "auto-", 2); err != nil {
		t.Fatal(err)
	}
	pts, err := topo.ListRestorePoints(ctx, s, p)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, rp := range pts {
		names = append(names, rp.Name)
	}
	sort.Strings(names)
	want := []string{"auto-20261130t090200", "auto-20261130t090300", "auto-x-20261130t090000", "auto-x-20261130t090100", "auto-x-20261130t090200", "auto-x-20261130t090300",
		"before-rebalance-2", "before-rebalance-3", "by-hand"}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Fatalf("left %v\nwant %v", names, want)
	}
}
