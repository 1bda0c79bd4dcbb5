package main

// --compare-pooler: the same run with the router direct and through each
// node's PgBouncer, on one environment, rounds of both alternating which
// goes first (issue 42's goals).

import (
	"context"
	"fmt"
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
	c := &benchkit.Comparison[Summary]{Modes: []string{"direct", "pooler"}}
	var err error
	first := os.Getenv("SHARDVISOR_BENCH_POOLER_FIRST") == "1"
	for i := range max(*rounds, 1) {
		r := benchkit.Round[Summary]{TLSFirst: first != (i%2 == 1)}
		for _, viaPooler := range []bool{r.TLSFirst, !r.TLSFirst} {
			mode := map[bool]string{false: "direct", true: "pooler"}[viaPooler]
			say("\n== round %d: %s", i+1, mode)
			*pooler = viaPooler
			var s *Summary
			s, err = run(ctx)
			if s != nil {
				report(s)
			}
			c.LoadAvg = append(c.LoadAvg, mode+" "+benchkit.LoadAvg(3))
			if viaPooler {
				r.TLS = s
			} else {
				r.Plain = s
			}
			if err != nil {
				err = fmt.Errorf("round %d, %s: %w", i+1, mode, err)
				break
			}
		}
		if err != nil {
			if i == 0 {
				c.Plain, c.TLS, c.TLSFirst = r.Plain, r.TLS, r.TLSFirst
			} else {
				c.Failed = &r
			}
			break
		}
		if i == 0 {
			c.Plain, c.TLS, c.TLSFirst = r.Plain, r.TLS, r.TLSFirst
		} else {
			c.More = append(c.More, r)
		}
	}
	c.Compare(poolerFigures)
	benchkit.Finish("moves-bench", c, err, func(c *benchkit.Comparison[Summary], e string) { c.Error = e },
		func(c *benchkit.Comparison[Summary]) { c.Verdict(); c.Report(&out.Printer) }, *out.JSON)
	for _, k := range c.Checks {
		if !k.Plain || !k.TLS {
			os.Exit(1)
		}
	}
}
