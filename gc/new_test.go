package gc

import (
	"context"
	"errors"
	"testing"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/topo"
)

// New takes the cluster's sharded tables and refuses what a run could
// only fail on: no sharded tables, a node that is not in the registry.
func TestIntegrationNew(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2, 1)
	ctx := context.Background()
	g, err := New(ctx, c.st, Options{Node: "n1"})
	if err != nil || len(g.Tables) != 1 || g.Tables[0] != events || g.Store != c.st || g.Opt.Node != "n1" {
		t.Fatalf("New: %+v %v", g, err)
	}
	if _, err := New(ctx, c.st, Options{Node: "n9"}); !errors.Is(err, bucketmap.ErrUnknownNode) {
		t.Fatalf("unknown node: %v", err)
	}
	if _, err := topo.RemoveTable(ctx, c.s, c.st.Paths(), events.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := New(ctx, c.st, Options{}); !errors.Is(err, ErrNoTables) {
		t.Fatalf("no sharded tables: %v", err)
	}
}
