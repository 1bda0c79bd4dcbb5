package main

import (
	"context"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/topo"
)

// hookTimeout bounds bringing one node's fence in step after a map change.
var hookTimeout = 10 * time.Second

// afterMapChange runs after every successful change of the bucket map made
// by shardctl (init, split, assign, node changes), with the new map. It
// brings every reachable db node's write fence in step with the map at
// once, concurrently. The map change has already happened, so nothing here
// fails it: a node that cannot be updated (unreachable, not prepared) is
// reported on stderr as drift for `shardctl node reconcile` to repair.
// Until the cluster has sharded tables the data side is not in use and
// nothing is done.
func afterMapChange(ctx context.Context, c *cli.Context, st *bucketmap.Store, m *bucketmap.Map) error {
	log, err := cliutil.Logger(c)
	if err != nil {
		log = zap.NewNop()
	}
	rec, err := topo.ReadCluster(ctx, st.Session(), st.Paths())
	if err != nil {
		fmt.Fprintf(c.App.ErrWriter, "shardctl: warning: fence drift: cannot read the cluster record to update the db nodes' fences to map version %d: %v; run `shardctl node reconcile`\n", m.Version, err)
		return nil
	}
	if len(rec.Tables) == 0 {
		log.Debug("no sharded tables; fences not updated")
		return nil
	}
	for _, r := range syncNodes(ctx, m, nil, hookTimeout) {
		if n, _ := m.Node(r.Node); n.State == bucketmap.NodeRemoved && r.Status != "repaired" {
			continue // out of service; owns nothing
		}
		switch r.Status {
		case "in-step", "repaired", "stale":
			log.Info("fence in step", zap.String("node", string(r.Node)), zap.String("status", r.Status), zap.Uint64("map_version", m.Version),
				zap.Strings("added", r.Added), zap.Strings("removed", r.Removed))
		case "not-installed":
			fmt.Fprintf(c.App.ErrWriter, "shardctl: warning: fence drift: node %s has no fence installed, so writes to it are not fenced; run `shardctl node prepare %s`\n", r.Node, r.Node)
		default:
			fmt.Fprintf(c.App.ErrWriter, "shardctl: warning: fence drift: node %s was not brought to map version %d (%s: %s); its fence keeps its previous ownership until `shardctl node reconcile` succeeds\n",
				r.Node, m.Version, r.Status, r.Detail)
			log.Warn("fence drift", zap.String("node", string(r.Node)), zap.String("status", r.Status), zap.String("detail", r.Detail), zap.Uint64("map_version", m.Version))
		}
	}
	return nil
}
