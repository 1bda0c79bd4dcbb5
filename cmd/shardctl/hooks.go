package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/cliutil"
)

// hookTimeout bounds bringing one node's fence in step after a map change.
var hookTimeout = fence.DefaultSyncTimeout

// afterMapChange runs after every successful change of the bucket map made
// by shardctl (init, split, assign, node changes), with the new map: the
// fence sync of every db node (fence.SyncAfterChange). The map change has
// already happened, so nothing here fails it: what could not be brought in
// step is reported on stderr as drift for `shardctl node reconcile`.
func afterMapChange(ctx context.Context, c *cli.Context, st *bucketmap.Store, m *bucketmap.Map) error {
	log, _ := cliutil.Logger(c) // nil: no logs
	res, err := fence.SyncAfterChange(ctx, st.Session(), st.Paths(), m, fence.SyncOptions{Timeout: hookTimeout, Logger: log})
	if err != nil {
		fmt.Fprintf(c.App.ErrWriter, "shardctl: warning: fence drift: cannot read the cluster record to update the db nodes' fences to map version %d: %v; run `shardctl node reconcile`\n", m.Version, err)
		return nil
	}
	for _, r := range res {
		switch r.Status {
		case fence.SyncInStep, fence.SyncRepaired, fence.SyncStale:
		case fence.SyncNotInstalled:
			fmt.Fprintf(c.App.ErrWriter, "shardctl: warning: fence drift: node %s has no fence installed, so writes to it are not fenced; run `shardctl node prepare %s`\n", r.Node, r.Node)
		default:
			fmt.Fprintf(c.App.ErrWriter, "shardctl: warning: fence drift: node %s was not brought to map version %d (%s: %s); its fence keeps its previous ownership until `shardctl node reconcile` succeeds\n",
				r.Node, m.Version, r.Status, r.Detail)
		}
	}
	return nil
}
