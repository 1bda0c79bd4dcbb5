package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/ownership"
)

// hookTimeout bounds bringing one node's fence in step after a map change.
var hookTimeout = fence.DefaultSyncTimeout

// owners is how shardctl changes the bucket map (init, split, assign, node
// changes, the map encoding): through package ownership, which brings every
// db node's fence along after each change.
func owners(c *cli.Context, st *bucketmap.Store) *ownership.Changer {
	log, _ := cliutil.Logger(c) // nil: no logs
	return ownership.New(st, ownership.Options{Timeout: hookTimeout, Logger: log})
}

// printDrift reports on stderr what a map change left behind: the change
// has already happened, so nothing here fails it; each fence that could not
// be brought in step is a warning naming `shardctl node reconcile` (or
// `shardctl node prepare`).
func printDrift(c *cli.Context, res *ownership.Result) {
	if res == nil {
		return
	}
	for _, w := range res.Warnings() {
		fmt.Fprintf(c.App.ErrWriter, "shardctl: warning: %s\n", w)
	}
}
