package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/gc"
	"github.com/shardvisor/shardvisor/internal/cliutil"
)

func runGC(c *cli.Context) error {
	if c.Int("batch") < 1 {
		return cliutil.Usagef("gc: --batch must be at least 1")
	}
	if _, err := gcOrder(c); err != nil {
		return err
	}
	if c.Int("parallel") < 1 {
		return cliutil.Usagef("gc: --parallel must be at least 1")
	}
	if c.Float64("rate") < 0 {
		return cliutil.Usagef("gc: --rate must not be negative")
	}
	if c.NArg() > 0 {
		return cliutil.Usagef("gc: unexpected arguments %v", c.Args().Slice())
	}
	every := c.Duration("every")
	// The member records each round saw, for the next: one that vanished
	// between rounds counts for a session timeout (gc.GC.Seen).
	seen := &fleet.Remembered{}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		reg := prometheus.NewRegistry()
		metrics := gc.NewMetrics(reg)
		stop, err := serveMetricsFlag(c, reg, log)
		if err != nil {
			return err
		}
		defer stop()
		for {
			err := gcRound(ctx, c, st, log, metrics, seen)
			if every == 0 {
				return err
			}
			if err != nil {
				log.Warn("gc: round", zap.Error(err))
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(every):
			}
		}
	})
}

func gcRound(ctx context.Context, c *cli.Context, st *bucketmap.Store, log *zap.Logger, metrics *gc.Metrics, seen *fleet.Remembered) error {
	order, _ := gcOrder(c) // checked by runGC
	opt := gc.Options{
		Grace: c.Duration("grace"), Batch: c.Int("batch"), Parallel: c.Int("parallel"), Order: order, Rate: c.Float64("rate"), DryRun: c.Bool("dry-run"),
		Node: bucketmap.NodeID(c.String("node")), MinOwnerRatio: c.Float64("min-owner-ratio"), Metrics: metrics, Logger: log,
	}
	if c.Duration("grace") == 0 {
		opt.Grace = -1 // an explicit 0 means none, not the default
	}
	g, err := gc.New(ctx, st, opt)
	if errors.Is(err, bucketmap.ErrUnknownNode) {
		return fmt.Errorf("gc: --node: %w", err)
	}
	if err != nil {
		return err
	}
	g.Seen = seen
	bar := newProgressBar(c)
	g.Opt.Progress = bar.update
	rep, err := g.Run(ctx) // takes the GC lock, and stops if it is lost
	bar.done()
	if rep != nil {
		if perr := cliutil.NewPrinter(c).Emit(rep, func(w io.Writer) { writeGCReport(w, rep) }); perr != nil {
			return perr
		}
		log.Info("gc: run", zap.Bool("dry_run", rep.DryRun), zap.Int64("deleted", rep.Deleted), zap.Int64("rows", rep.Rows), zap.Int("batches", rep.Batches),
			zap.Duration("max_batch", rep.MaxBatch), zap.Int("skipped", len(rep.Skipped)), zap.Int("uncertain", rep.Uncertain()), zap.Int("history_pruned", rep.Pruned))
	}
	if err != nil {
		return err
	}
	if n := rep.Uncertain(); n > 0 {
		return fmt.Errorf("gc: %d ranges skipped because something is uncertain (see above); nothing of them was deleted", n)
	}
	return nil
}

func writeGCReport(w io.Writer, rep *gc.Report) {
	verb := "deleted"
	if rep.DryRun {
		verb = "would delete"
	}
	fmt.Fprintf(w, "gc at map version %d (level %d)%s\n", rep.MapVersion, rep.Level, map[bool]string{true: ", dry run: nothing is deleted", false: ""}[rep.DryRun])
	if len(rep.Work) > 0 {
		fmt.Fprintf(w, "%-12s %-24s %-28s %-12s %12s %12s %s\n", "NODE", "TABLE", "RANGE", "OWNER", "ROWS", "OWNER-ROWS", "ORDER")
	}
	for _, wk := range rep.Work {
		for _, t := range wk.Tables {
			rng := fmt.Sprintf("buckets %d..%d", wk.Lo, wk.Hi)
			if wk.Lo == wk.Hi {
				rng = fmt.Sprintf("bucket %d", wk.Lo)
			}
			n := t.Rows
			if !rep.DryRun {
				n = t.Deleted
			}
			order := t.Order // chosen when deleting; a dry run does not sample
			if order == "" {
				order = "-"
			}
			fmt.Fprintf(w, "%-12s %-24s %-28s %-12s %12d %12d %s\n", wk.Node, t.Table, rng, wk.Owner, n, t.OwnerRows, order)
		}
	}
	for _, s := range rep.Skipped {
		mark := "skipped"
		if s.Uncertain {
			mark = "SKIPPED (uncertain)"
		}
		fmt.Fprintf(w, "%s: %s: %s: %s\n", mark, s.Range.String(), s.Kind, s.Reason)
	}
	if rep.DryRun {
		fmt.Fprintf(w, "%s %d rows in %d ranges; %d ranges skipped\n", verb, rep.Rows, len(rep.Work), len(rep.Skipped))
		return
	}
	rate := float64(rep.Deleted) / max(rep.Elapsed.Seconds(), 1e-9)
	fmt.Fprintf(w, "%s %d rows in %d batches (%.0f rows/s, longest batch %.1f ms) in %s (checking %s, in delete transactions %s); %d history entries pruned; %d ranges skipped\n",
		verb, rep.Deleted, rep.Batches, rate, rep.MaxBatchMS, rep.Elapsed.Round(time.Millisecond), rep.Checking.Round(time.Millisecond), rep.Deleting.Round(time.Millisecond), rep.Pruned, len(rep.Skipped))
	for _, e := range rep.PruneErrors {
		fmt.Fprintf(w, "pruning the history failed (the next run retries): %s\n", e)
	}
}

// progressBar draws GC's progress on stderr when it is a terminal (and
// output is not --json); otherwise it does nothing (logs carry progress).
type progressBar struct {
	w    io.Writer
	on   bool
	last time.Time
	drew bool
}

func newProgressBar(c *cli.Context) *progressBar {
	p := &progressBar{w: c.App.ErrWriter}
	if f, ok := c.App.ErrWriter.(*os.File); ok && !c.Bool(cliutil.FlagJSON) {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.on = true
		}
	}
	return p
}

func (p *progressBar) update(pr gc.Progress) {
	if !p.on || time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	frac := 0.0
	if pr.Total > 0 {
		frac = min(1, float64(pr.Deleted)/float64(pr.Total))
	}
	const width = 30
	fill := int(frac * width)
	rate := float64(pr.Deleted) / max(pr.Elapsed.Seconds(), 1e-9)
	fmt.Fprintf(p.w, "\r[%s%s] %3.0f%% %d/%d rows, %.0f rows/s, %s %s   ", strings.Repeat("#", fill), strings.Repeat(" ", width-fill), 100*frac, pr.Deleted, pr.Total, rate, pr.Node, pr.Table)
	p.drew = true
}

func (p *progressBar) done() {
	if p.drew {
		fmt.Fprintln(p.w)
	}
}

// gcOrder is --order as gc.Options.Order.
func gcOrder(c *cli.Context) (string, error) {
	switch o := c.String("order"); o {
	case "auto":
		return gc.OrderAuto, nil
	case gc.OrderKey, gc.OrderHeap:
		return o, nil
	default:
		return "", cliutil.Usagef("gc: --order must be auto, key or heap, not %q", o)
	}
}
