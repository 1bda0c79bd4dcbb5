package main

import (
	"context"

	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/bucketmap"
)

// afterMapChange runs after every successful change of the bucket map made
// by shardctl (init, split, assign, node changes), with the new map. The
// data side uses it to bring each db node's write fence in step with the
// map at once instead of waiting for the reconciler.
func afterMapChange(ctx context.Context, c *cli.Context, st *bucketmap.Store, m *bucketmap.Map) error {
	return nil
}
