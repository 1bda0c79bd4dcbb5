package fence

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/topo"
)

// PrepareResult is what Prepare did to a node and what it found wrong.
type PrepareResult struct {
	InstallResult
	// Change is what filling the ownership table changed.
	Change Change
	// Mismatches are the sharded-table contract checks that fail.
	Mismatches []Mismatch
}

// Prepare makes a db node ready for the cluster, idempotently: it installs
// the fence (Install), fills the ownership table from m (Sync; a fence
// that has applied a newer map is left as it is) and checks the sharded
// tables against the contract (CheckTables). The result's Actions say
// what changed; Problems and Mismatches what the operator must fix.
func Prepare(ctx context.Context, conn *pgx.Conn, rec *topo.ClusterRecord, m *bucketmap.Map, node bucketmap.NodeID) (*PrepareResult, error) {
	inst, err := Install(ctx, conn, rec.Name, node, rec.Tables)
	if err != nil {
		return nil, err
	}
	res := &PrepareResult{InstallResult: inst}
	if res.Change, err = Sync(ctx, conn, m, node); err != nil && !errors.Is(err, ErrStale) {
		return nil, fmt.Errorf("filling the ownership table: %w", err)
	}
	if res.Mismatches, err = CheckTables(ctx, conn, rec.Tables); err != nil {
		return nil, err
	}
	if ch := res.Change; ch.Changed() {
		res.Actions = append(res.Actions, fmt.Sprintf("ownership table set to map version %d: %d ranges added, %d removed", m.Version, len(ch.Added), len(ch.Removed)))
	}
	return res, nil
}

// Check verifies a db node against the sharded-table contract and against
// map m (CheckTables and CheckFence) in one read-only transaction, so that
// it cannot change anything.
func Check(ctx context.Context, conn *pgx.Conn, rec *topo.ClusterRecord, m *bucketmap.Map, node bucketmap.NodeID) ([]Mismatch, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	mism, err := CheckTables(ctx, tx, rec.Tables)
	if err != nil {
		return nil, err
	}
	fm, err := CheckFence(ctx, tx, rec.Name, rec.Tables, m, node)
	if err != nil {
		return nil, err
	}
	return append(mism, fm...), nil
}
