package main

// --compare-pooler: the same run with the router direct and through each
// node's PgBouncer, on one environment, rounds of both alternating which
// goes first (issue 42's goals).

import (
	"context"
	"os"

	"github.com/shardvisor/shardvisor/internal/benchkit"
)

// Issue 42's bounds, through the pooler against direct at the same
// offered load: the write p99 1.3×, the move pause p99 1.2×.
const (
	poolerWriteGoal = 1.3
	poolerPauseGoal = 1.2
)

var poolerFigures = []benchkit.Figure{{Name: "write p99 through router.Do (ms, node added on)", Path: "write_latency_ms.p99", Goal: poolerWriteGoal},
	{Name: "move pause p99 (ms, mover record)", Path: "pause_ms.p99", Goal: poolerPauseGoal},
	{Name: "write p50 through router.Do (ms)", Path: "write_latency_ms.p50"},
	{Name: "write p99, steady (before the node)", Path: "write_latency_steady_ms.p99"}, {Name: "write p99, adding the node and rebalancing", Path: "write_latency_rebalance_ms.p99"},
	{Name: "write p99, rebalance, bucket moving", Path: "write_latency_moving_ms.p99"},
	{Name: "moving window p99, router (ms)", Path: "router_pause_ms.p99"}, {Name: "rollback pause p99 (ms)", Path: "rollback_pause_ms.p99"},
	{Name: "writes/s during the moves", Path: "writes_per_s_during_moves"}, {Name: "rebalance (s)", Path: "rebalance_seconds"},
	{Name: "acknowledged writes lost: 0", Path: "missing_acknowledged_writes", Zero: true}, {Name: "moves aborted: 0", Path: "moves_aborted", Zero: true}}

func comparePoolerMain(ctx context.Context) {
	c, err := benchkit.Alternate([2]string{"direct", "pooler"}, *rounds, os.Getenv("SHARDVISOR_BENCH_POOLER_FIRST") == "1", say,
		func(viaPooler bool) (*Summary, error) { *pooler = viaPooler; return run(ctx) }, report)
	c.Conclude("moves-bench", poolerFigures, err, &out.Printer, *out.JSON)
}
