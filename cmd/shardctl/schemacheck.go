package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
)

// schemaAcrossNodes is node check's comparison of node n's sharded tables
// with every other db node's that is not down (fence.CompareSchemas):
// each difference becomes a mismatch, by kind, table and column, with
// what each node has. A peer that cannot be reached is said on stderr and
// logged, and does not fail the check (it checks n, not the peer).
func schemaAcrossNodes(ctx context.Context, c *cli.Context, d *dataContext, n bucketmap.Node, conn *pgx.Conn) ([]fence.Mismatch, error) {
	if len(d.rec.Tables) == 0 {
		return nil, nil
	}
	mine, err := fence.ReadSchemas(ctx, conn, d.rec.Tables)
	if err != nil {
		return nil, fmt.Errorf("node check %s: %w", n.ID, err)
	}
	var out []fence.Mismatch
	for _, peer := range d.m.Nodes() {
		if peer.ID == n.ID || peer.State == bucketmap.NodeDown {
			continue
		}
		theirs, err := peerSchemas(ctx, d, peer)
		if err != nil {
			fmt.Fprintf(c.App.ErrWriter, "node %s: schema not compared with node %s: %v\n", n.ID, peer.ID, err)
			d.log.Warn("node check: schema not compared with a peer", zap.String("node", string(n.ID)), zap.String("peer", string(peer.ID)), zap.Error(err))
			continue
		}
		out = append(out, fence.SchemaMismatches(fence.CompareSchemas(string(n.ID), mine, string(peer.ID), theirs))...)
	}
	return out, nil
}

func peerSchemas(ctx context.Context, d *dataContext, peer bucketmap.Node) ([]fence.TableSchema, error) {
	pc, err := dbnode.Connect(ctx, peer)
	if err != nil {
		return nil, err
	}
	defer pc.Close(context.WithoutCancel(ctx))
	return fence.ReadSchemas(ctx, pc, d.rec.Tables)
}
