package main

import (
	"context"
	"fmt"
	"io"
	"sort"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/sizing"
	"github.com/shardvisor/shardvisor/topo"
)

// sizePolicy reads --by and the planner by size's flags: nil for --by
// count (recordedBy gives the cluster's mode when --by is not given).
func sizePolicy(c *cli.Context) (*bucketmap.SizePolicy, error) {
	return sizePolicyFor(c, c.String("by"))
}

// byFlag reads --by as a balance mode (topo.ParseBalanceMode).
func byFlag(c *cli.Context) (string, error) {
	by, err := topo.ParseBalanceMode(c.String("by"))
	if err != nil {
		return "", cliutil.Usagef("--by must be %s, not %q", topo.BalanceModes, c.String("by"))
	}
	return by, nil
}

// recordedBy is --by, or the cluster's balance mode when --by is not
// given.
func recordedBy(ctx context.Context, c *cli.Context, st *bucketmap.Store) (string, error) {
	if c.IsSet("by") {
		return byFlag(c)
	}
	rec, err := topo.ReadRebalance(ctx, st.Session(), st.Paths())
	return rec.Mode(), err
}

func sizePolicyFor(c *cli.Context, by string) (*bucketmap.SizePolicy, error) {
	by, err := topo.ParseBalanceMode(by)
	if err != nil {
		return nil, cliutil.Usagef("--by must be %s, not %q", topo.BalanceModes, c.String("by"))
	}
	if by == topo.BalanceCount {
		return nil, nil
	}
	p := &bucketmap.SizePolicy{By: by, Tolerance: c.Float64("tolerance"), Improvement: c.Float64("improvement"),
		MaxDepth: c.Int("max-depth"), MinSplitBytes: c.Int64("min-split-bytes")}
	if p.Tolerance <= 0 || p.Tolerance > 10 {
		return nil, cliutil.Usagef("--tolerance must be above 0 (0.10 is 10%%), not %g", p.Tolerance)
	}
	if p.Improvement <= 0 || p.Improvement >= 1 {
		return nil, cliutil.Usagef("--improvement must be between 0 and 1, not %g", p.Improvement)
	}
	if p.MaxDepth < 1 || p.MaxDepth > bucketmap.MaxDepth {
		return nil, cliutil.Usagef("--max-depth must be 1..%d, not %d", bucketmap.MaxDepth, p.MaxDepth)
	}
	if p.MinSplitBytes < 0 {
		return nil, cliutil.Usagef("--min-split-bytes must not be negative")
	}
	return p, nil
}

func sizingOptions(c *cli.Context) (sizing.Options, error) {
	o := sizing.Options{ExactBelow: c.Int64("exact-below"), SampleRows: c.Int64("sample-rows")}
	if o.ExactBelow == 0 || o.ExactBelow < -1 {
		return o, cliutil.Usagef("--exact-below must be a row count above 0, or -1 (always exact), not %d", o.ExactBelow)
	}
	if o.SampleRows <= 0 {
		return o, cliutil.Usagef("--sample-rows must be above 0, not %d", o.SampleRows)
	}
	return o, nil
}

func runBuckets(c *cli.Context) error {
	opt, err := sizingOptions(c)
	if err != nil {
		return err
	}
	if c.Int("top") < 0 {
		return cliutil.Usagef("buckets: --top must not be negative")
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		m, _, err := st.Load(ctx)
		if err != nil {
			return err
		}
		crec, err := topo.ReadCluster(ctx, st.Session(), st.Paths())
		if err != nil {
			return err
		}
		rep, err := sizing.Measure(ctx, m, crec.Tables, opt)
		if err != nil {
			return err
		}
		if n := c.Int("top"); n > 0 && len(rep.Buckets) > n {
			rep.Buckets = rep.Buckets[:n]
		}
		return cliutil.NewPrinter(c).Emit(rep, func(w io.Writer) { writeBuckets(w, m, rep) })
	})
}

func writeBuckets(w io.Writer, m *bucketmap.Map, rep *sizing.Report) {
	var total bucketmap.Size
	for _, n := range rep.Nodes {
		total.Rows += n.Owned.Rows
		total.Bytes += n.Owned.Bytes
	}
	fmt.Fprintf(w, "map version %d, %d buckets at %s, measured %s: %s rows, %s owned\n", rep.MapVersion, m.Buckets(), depths(m.MinDepth(), m.Level),
		rep.At.Format("2006-01-02T15:04:05Z"), count(total.Rows), byteSize(total.Bytes))
	fmt.Fprintf(w, "%-12s %-12s %12s %10s %7s\n", "BUCKET", "OWNER", "ROWS", "BYTES", "SHARE")
	for _, b := range rep.Buckets {
		share := 0.0
		if total.Bytes > 0 {
			share = 100 * float64(b.Bytes) / float64(total.Bytes)
		}
		fmt.Fprintf(w, "%-12s %-12s %12s %10s %6.1f%%\n", b.Name, b.Owner, count(b.Rows), byteSize(b.Bytes), share)
	}
	writeMeasured(w, rep.Nodes)
}

// writeMeasured is a measurement's figures per node: owned rows and
// their live bytes (what the planner balances, and what stays after GC),
// leftovers (GC's to delete), dead rows (vacuum's, estimated) and the
// size on disk, which holds all of them plus indexes and free space.
func writeMeasured(w io.Writer, list []sizing.NodeReport) {
	fmt.Fprintf(w, "%-12s %10s %10s %10s %10s %10s %10s %10s  %s\n", "NODE", "OWNED ROWS", "LIVE", "LEFTOVER", "BYTES", "DEAD ROWS", "BYTES", "ON DISK", "METHOD")
	nodes := append([]sizing.NodeReport(nil), list...)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Node < nodes[j].Node })
	for _, n := range nodes {
		meth := ""
		for i, t := range n.Tables {
			if i > 0 {
				meth += ", "
			}
			meth += t.Table + " " + t.Method
		}
		fmt.Fprintf(w, "%-12s %10s %10s %10s %10s %10s %10s %10s  %s\n", n.Node, count(n.Owned.Rows), byteSize(n.Owned.Bytes), count(n.Leftover.Rows), byteSize(n.Leftover.Bytes),
			count(n.Dead.Rows), byteSize(n.Dead.Bytes), byteSize(n.Physical), meth)
	}
}

func count(n int64) string {
	switch {
	case n >= 10_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 100_000:
		return fmt.Sprintf("%.0fk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// sizePlanOut is `plan --by size|rows --json`: the plan, and the
// measurement it was made from (physical size, dead rows and leftovers
// per node, which the plan does not balance).
type sizePlanOut struct {
	*bucketmap.SizePlan
	Measured []sizing.NodeReport `json:"measured"`
}

func writeSizePlan(w io.Writer, m *bucketmap.Map, p *bucketmap.SizePlan, meas *sizing.Report) {
	what := "live bytes of the owned rows"
	if p.By == topo.BalanceRows {
		what = "owned rows"
	}
	fmt.Fprintf(w, "plan by %s (%s) for map version %d: split %d bucket(s), then %d moves\n", p.By, what, p.MapVersion, len(p.Split), len(p.Moves))
	for _, b := range p.Split {
		fmt.Fprintf(w, "  split bucket %s\n", m.Name(b))
	}
	for i, mv := range p.Moves {
		if i == 50 {
			fmt.Fprintf(w, "  ... %d more (see --json)\n", len(p.Moves)-50)
			break
		}
		fmt.Fprintf(w, "  move bucket %s: %s -> %s\n", mv.Bucket, mv.From, mv.To)
	}
	unit := func(v int64) string {
		if p.By == "rows" {
			return count(v)
		}
		return byteSize(v)
	}
	// NOW is what each node owns now, AFTER what it will own once the
	// plan has run and GC deleted the copies left behind: both in the
	// measure balanced.
	fmt.Fprintf(w, "%-12s %12s %12s %12s %8s %8s\n", "NODE", "NOW", "AFTER", "FAIR", "NOW/FAIR", "AFTER/FAIR")
	var ids []string
	for id := range p.Before {
		ids = append(ids, string(id))
	}
	sort.Strings(ids)
	for _, id := range ids {
		n := bucketmap.NodeID(id)
		r0, r := "-", "-"
		if f := p.Fair[n]; f > 0 {
			r0 = fmt.Sprintf("%.3f", float64(p.Before[n])/float64(f))
			r = fmt.Sprintf("%.3f", float64(p.After[n])/float64(f))
		}
		fmt.Fprintf(w, "%-12s %12s %12s %12s %8s %8s\n", id, unit(p.Before[n]), unit(p.After[n]), unit(p.Fair[n]), r0, r)
	}
	if p.Balanced {
		fmt.Fprintf(w, "balanced after the plan: the largest node at %.3f of its fair share\n", p.MaxOverFair)
	} else {
		fmt.Fprintf(w, "NOT balanced after the plan (largest at %.3f of its fair share)\n", p.MaxOverFair)
		for _, s := range p.Stuck {
			fmt.Fprintf(w, "  cannot split %s\n", s)
		}
		for _, b := range p.Unknown {
			fmt.Fprintf(w, "  bucket %s would need a split, but its halves were not measured: rebalance --by %s splits, measures and plans again\n", b, p.By)
		}
	}
	if meas != nil {
		fmt.Fprintf(w, "measured %s (leftovers, dead rows and the size on disk are shown, not balanced):\n", meas.At.Format("2006-01-02T15:04:05Z"))
		writeMeasured(w, meas.Nodes)
	}
}
