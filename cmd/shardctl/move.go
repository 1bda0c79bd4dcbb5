package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/topo"
)

// withMover connects and hands fn a mover (with the options moveFlags set)
// whose progress goes to stderr (stdout stays clean for --json), serving
// its metrics while fn runs if --metrics-addr says where.
func withMover(c *cli.Context, fn func(ctx context.Context, mv *migrate.Mover, st *bucketmap.Store) error) error {
	// Commands without moveFlags read "" here: the mover's default.
	if o := c.String("on-straggler"); o != "" && migrate.CheckOnStraggler(o) != nil {
		return cliutil.Usagef("--on-straggler must be %s or %s, not %q", migrate.StragglerProceed, migrate.StragglerAbort, o)
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		reg := prometheus.NewRegistry()
		opts := migrate.Options{Logger: log, MaxLag: c.Duration("max-lag"), PauseCap: c.Duration("pause-cap"),
			MemberWait: c.Duration("member-wait"), CatchupTimeout: c.Duration("catchup-timeout"),
			OnStraggler: c.String("on-straggler"), Metrics: migrate.NewMetrics(reg), Window: c.Duration("window")}
		if opts.Window < 0 {
			return cliutil.Usagef("--window must not be negative, not %s", opts.Window)
		}
		stopMetrics, err := serveMetricsFlag(c, reg, log)
		if err != nil {
			return err
		}
		defer stopMetrics()
		opts.Progress = func(prog migrate.Progress) {
			rec, msg := prog.Move, prog.Message
			fmt.Fprintf(c.App.ErrWriter, "%s  move %s (bucket %d/%d %s -> %s): %s\n", time.Now().Format("15:04:05.000"), rec.ID, rec.Bucket, rec.Level, rec.Source, rec.Target, msg)
		}
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		mv := migrate.New(st, opts)
		defer mv.Close()
		return fn(ctx, mv, st)
	})
}

func writeMove(w io.Writer, r *topo.MoveRecord) { writeMoveProbed(w, r, nil) }

// writeMoveProbed is writeMove with the reverse stream's state as probed
// from the servers (nil: not probed; the record's word is then given as
// such, never as "running").
func writeMoveProbed(w io.Writer, r *topo.MoveRecord, probe *migrate.ReverseProbe) {
	fmt.Fprintf(w, "move %s: bucket %d (level %d) %s -> %s: %s\n", r.ID, r.Bucket, r.Level, r.Source, r.Target, r.State)
	if r.NoCopy {
		fmt.Fprintln(w, "  NO COPY: ownership changed without copying rows (bucket marked data-lost)")
	}
	s := r.Stats
	fmt.Fprintf(w, "  rows copied %d in %.0f ms, lag at fence %.1f ms, member wait %.1f ms, write pause %.1f ms\n", s.RowsCopied, s.CopyMS, s.LagAtFenceMS, s.MemberWaitMS, s.PauseMS)
	if len(s.Phases) > 0 {
		took := "so far"
		if r.Finished() {
			took = "in all"
		}
		fmt.Fprintf(w, "  %.0f ms %s; phases: %s\n", r.ElapsedMS(), took, s.DescribePhases(0, false))
		if p := s.DescribePause(); p != "" {
			fmt.Fprintf(w, "  write pause phases: %s\n", p)
		}
	}
	if len(r.Stragglers) > 0 {
		fmt.Fprintf(w, "  %d stragglers: members that had not applied map version %d (bucket moving) when the member wait ran out\n", len(r.Stragglers), r.FenceVersion)
		for _, st := range r.Stragglers {
			if st.Error != "" {
				fmt.Fprintf(w, "    %s: %s\n", st.Member, st.Error)
			} else {
				fmt.Fprintf(w, "    %s: at map version %d\n", st.Member, st.MapVersion)
			}
		}
	}
	if v := r.Verify; v != nil {
		switch {
		case v.Inconclusive:
			fmt.Fprintln(w, "  verify: inconclusive (the mover restarted after the flip)")
		case v.OK:
			fmt.Fprintf(w, "  verify: ok (%d tables)\n", len(v.Tables))
		default:
			fmt.Fprintln(w, "  verify: MISMATCH")
		}
		for _, t := range v.Tables {
			fmt.Fprintf(w, "    %s: source %d rows, target %d rows\n", t.Table, t.SourceRows, t.TargetRows)
		}
	}
	if since, frozen := migrate.FrozenSince(r); frozen {
		fmt.Fprintf(w, "  WRITE PAUSE OPEN since %s (%s): bucket %d's writes are refused on every node until the move is resumed or rolled back; `rebalance --watch` does it once the mover's runner lock is gone, or run `shardctl move resume %s`\n",
			since.Local().Format("15:04:05.000"), time.Since(since).Round(time.Millisecond), r.Bucket, r.ID)
	}
	if r.PauseEndedAt != nil && r.FreezeStartedAt != nil {
		fmt.Fprintf(w, "  write pause rolled back: %s to %s\n", r.FreezeStartedAt.Local().Format("15:04:05.000"), r.PauseEndedAt.Local().Format("15:04:05.000"))
	}
	if r.SlotPending {
		fmt.Fprintf(w, "  slot %s is still on the source (it was unreachable); `shardctl move resume %s` drops it\n", r.Slot, r.ID)
	}
	writeReverse(w, r, probe)
	if r.Error != "" {
		fmt.Fprintf(w, "  error: %s\n", r.Error)
	}
}

func runMove(c *cli.Context) error {
	if c.NArg() != 1 || c.String("to") == "" {
		return cliutil.Usagef("move: want BUCKET --to NODE")
	}
	b, err := bucketmap.ParseBucket(c.Args().Get(0))
	if err != nil {
		return cliutil.Usagef("move: %v", err)
	}
	if c.Bool("no-copy") {
		fmt.Fprintf(c.App.ErrWriter, "WARNING: --no-copy: bucket %s's rows will NOT be copied to %s; they stay on the old owner until GC deletes them\n", c.Args().Get(0), c.String("to"))
	}
	return withMover(c, func(ctx context.Context, mv *migrate.Mover, _ *bucketmap.Store) error {
		rec, err := mv.MoveBucket(ctx, b, bucketmap.NodeID(c.String("to")), c.Bool("no-copy"))
		if perr := printMove(c, rec); perr != nil {
			return perr
		}
		if err != nil && ctx.Err() != nil && rec != nil && !rec.Finished() {
			// Interrupted: the move is left as it was, and a rebalance
			// --watch process takes it over and finishes it.
			fmt.Fprintf(c.App.ErrWriter, "interrupted: move %s is left in %s; a `shardctl rebalance --watch` process takes it over within the session timeout and finishes it (or rolls it back if it was in its write pause). To roll it back now: shardctl move abort %s\n", rec.ID, rec.State, rec.ID)
		}
		return err
	})
}

// withMoveID runs fn with a mover and the one move ID that move status,
// resume and abort take.
func withMoveID(c *cli.Context, fn func(ctx context.Context, mv *migrate.Mover, id string) error) error {
	if c.NArg() != 1 {
		return cliutil.Usagef("move %s: want a move ID", c.Command.Name)
	}
	return withMover(c, func(ctx context.Context, mv *migrate.Mover, _ *bucketmap.Store) error {
		return fn(ctx, mv, c.Args().Get(0))
	})
}

// printMove prints a move's record, if there is one.
func printMove(c *cli.Context, rec *topo.MoveRecord) error {
	if rec == nil {
		return nil
	}
	return cliutil.NewPrinter(c).Emit(rec, func(w io.Writer) { writeMove(w, rec) })
}

// moveStatus is `move status --json`: the record, with its reverse
// stream as the servers have it ("reverse_probe": state running,
// disabled, lost or unknown, reason, lag_bytes), for a move in its window.
type moveStatus struct {
	*topo.MoveRecord
	ReverseProbe *migrate.ReverseProbe `json:"reverse_probe,omitempty"`
}

func runMoveStatus(c *cli.Context) error {
	return withMoveID(c, func(ctx context.Context, mv *migrate.Mover, id string) error {
		rec, err := mv.Get(ctx, id)
		if err != nil {
			return err
		}
		// The reverse stream's state is read from the servers: the
		// record only says that it was started.
		st := moveStatus{MoveRecord: rec, ReverseProbe: mv.ProbeReverse(ctx, rec)}
		return cliutil.NewPrinter(c).Emit(st, func(w io.Writer) {
			writeMoveProbed(w, rec, st.ReverseProbe)
			for _, st := range rec.Steps {
				fmt.Fprintf(w, "  %s  %s\n", st.At.Format("15:04:05.000"), st.State)
			}
		})
	})
}

// runMoveResume and runMoveAbort report the mover's error, not a failure
// to print the record.
func runMoveResume(c *cli.Context) error {
	return withMoveID(c, func(ctx context.Context, mv *migrate.Mover, id string) error {
		rec, err := mv.Resume(ctx, id)
		printMove(c, rec)
		return err
	})
}

func runMoveRollback(c *cli.Context) error {
	return withMoveID(c, func(ctx context.Context, mv *migrate.Mover, id string) error {
		rec, err := mv.Rollback(ctx, id)
		printMove(c, rec)
		return err
	})
}

func runMoveComplete(c *cli.Context) error {
	return withMoveID(c, func(ctx context.Context, mv *migrate.Mover, id string) error {
		rec, err := mv.Complete(ctx, id)
		printMove(c, rec)
		return err
	})
}

// writeReverse says where a move's way back stands: as probed from the
// servers if probe is set.
func writeReverse(w io.Writer, r *topo.MoveRecord, probe *migrate.ReverseProbe) {
	if r.RollbackOf != "" {
		fmt.Fprintf(w, "  rollback of move %s (over its reverse stream)\n", r.RollbackOf)
	}
	rv := r.Reverse
	if rv == nil {
		return
	}
	switch {
	case rv.Lost != "":
		fmt.Fprintf(w, "  reverse stream: none (%s): no rollback possible\n", rv.Lost)
	case probe != nil && probe.State == migrate.ReverseLost:
		fmt.Fprintf(w, "  reverse stream %s -> %s LOST (%s): no rollback possible; `rebalance --watch` ends the window, or `shardctl move complete %s`\n", r.Target, r.Source, probe.Reason, r.ID)
	case r.State == topo.MoveReversible && rv.Until != nil:
		left := time.Until(*rv.Until).Round(time.Second)
		if left < 0 {
			left = 0
		}
		fmt.Fprintf(w, "  reverse stream %s -> %s %s from %s; rollback window until %s (%s left): `shardctl move rollback %s` gives the bucket back with every write since the flip, `shardctl move complete %s` ends the window now\n",
			r.Target, r.Source, describeProbe(probe), rv.StartLSN, rv.Until.Local().Format("15:04:05"), left, r.ID, r.ID)
	case rv.Enabled && !r.Finished():
		fmt.Fprintf(w, "  reverse stream %s -> %s %s from %s\n", r.Target, r.Source, describeProbe(probe), rv.StartLSN)
	}
	if rv.RollbackWanted != "" && r.State != topo.MoveRolledBack {
		fmt.Fprintf(w, "  ROLLBACK WANTED (%s): `rebalance --watch` or `shardctl move rollback %s` runs it\n", rv.RollbackWanted, r.ID)
	}
	if rv.Rollback != "" {
		fmt.Fprintf(w, "  rollback move: %s\n", rv.Rollback)
	}
	if rv.SlotPending {
		fmt.Fprintf(w, "  reverse slot %s is still on %s (it was unreachable); `shardctl move resume %s` drops it\n", rv.Slot, r.Target, r.ID)
	}
	if v := r.Verify; v != nil {
		for _, ch := range v.Chunks {
			fmt.Fprintf(w, "    %s keys %d..%d: source %d rows, target %d\n", ch.Table, ch.Lo, ch.Hi, ch.SourceRows, ch.TargetRows)
			for _, row := range ch.Rows {
				fmt.Fprintf(w, "      %s\n", row)
			}
		}
	}
}

func runMoveAbort(c *cli.Context) error {
	return withMoveID(c, func(ctx context.Context, mv *migrate.Mover, id string) error {
		if c.Bool("after-failure") {
			return abortAfterFailure(ctx, c, mv, id)
		}
		rec, err := mv.Abort(ctx, id, "aborted by an operator")
		printMove(c, rec)
		if err != nil && rec != nil && rec.State == topo.MoveAborted {
			return nil
		}
		return err
	})
}

func runMoves(c *cli.Context) error {
	return withMover(c, func(ctx context.Context, mv *migrate.Mover, _ *bucketmap.Store) error {
		list, err := mv.List(ctx)
		if err != nil {
			return err
		}
		if list == nil {
			list = []*topo.MoveRecord{}
		}
		return cliutil.NewPrinter(c).Emit(list, func(w io.Writer) {
			if len(list) == 0 {
				fmt.Fprintln(w, "no moves")
				return
			}
			fmt.Fprintf(w, "%-28s %7s %-10s %-10s %-11s %8s %9s %9s %9s  %-19s  %s\n", "ID", "BUCKET", "FROM", "TO", "STATE", "ROWS", "TOOK", "COPY", "PAUSE", "STARTED", "WINDOW")
			for _, r := range list {
				fmt.Fprintf(w, "%-28s %7s %-10s %-10s %-11s %8d %7.0fms %7.0fms %7.1fms  %s  %s\n", r.ID, fmt.Sprintf("%d/%d", r.Bucket, r.Level), r.Source, r.Target, r.State,
					r.Stats.RowsCopied, r.ElapsedMS(), r.Stats.CopyMS, r.Stats.PauseMS, r.CreatedAt.Local().Format("2006-01-02 15:04:05"), windowNote(r))
			}
		})
	})
}

func runRebalance(c *cli.Context) error {
	return withMover(c, func(ctx context.Context, mv *migrate.Mover, st *bucketmap.Store) error {
		rb := migrate.NewRebalancer(mv, policy(c))
		if _, err := sizePolicy(c); err != nil {
			return err // a bad flag, before anything is recorded
		}
		if c.IsSet("by") && c.Bool("watch") && c.String("by") != topo.BalanceCount {
			return cliutil.Usagef("rebalance: --by %s measures every node on each run; it runs once, not with --watch (a watcher of a cluster that balances by size heals moves and plans none by count)", c.String("by"))
		}
		if c.Bool("set-mode") && !c.IsSet("by") {
			return cliutil.Usagef("rebalance: --set-mode records the mode --by names: give --by %s", topo.BalanceModes)
		}
		by, err := recordedBy(ctx, c, st)
		if err != nil {
			return err
		}
		if !c.Bool("dry-run") && !c.Bool("pause") {
			if err := changeMode(ctx, c, rb, by); err != nil {
				return err
			}
		}
		sp, err := sizePolicyFor(c, by)
		if err != nil {
			return err
		}
		if sp != nil && !c.Bool("watch") {
			if rb.Sizing, err = sizingOptions(c); err != nil {
				return err
			}
			rb.BySize = sp
		}
		rb.Progress = func(prog migrate.Progress) {
			msg := prog.Message
			fmt.Fprintf(c.App.ErrWriter, "%s  rebalance: %s\n", time.Now().Format("15:04:05.000"), msg)
		}
		rb.BeforeChanges = func(ctx context.Context) error { return pointBefore(ctx, c, st, zap.L(), "rebalance") }
		switch {
		case c.Bool("pause"):
			return rb.Pause(ctx, "paused by an operator")
		case c.Bool("resume"):
			if err := rb.Resume(ctx); err != nil {
				return err
			}
		}
		if c.Bool("dry-run") {
			return printPlan(ctx, c, st)
		}
		if c.Bool("watch") {
			err := rb.RunForever(ctx)
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		rep, err := rb.Run(ctx)
		if perr := cliutil.NewPrinter(c).Emit(rep, func(w io.Writer) {
			if rb.BySize != nil {
				fmt.Fprintf(w, "%d moves, %d buckets split; balanced by %s: %v (largest node at %.3f of its fair share; once GC has run, at %.3f in live bytes and %.3f in rows)\n",
					len(rep.Moves), len(rep.SplitBuckets), rb.BySize.By, rep.Balanced, rep.MaxOverFair, rep.MaxOverFairBytes, rep.MaxOverFairRows)
				if len(rep.Measured) > 0 {
					writeMeasured(w, rep.Measured)
				}
				for _, s := range rep.Stuck {
					fmt.Fprintf(w, "  cannot split %s\n", s)
				}
			} else {
				fmt.Fprintf(w, "%d moves, %d splits, %d reassigned without copy; balanced: %v\n", len(rep.Moves), rep.Splits, rep.Reassigned, rep.Balanced)
			}
			for _, r := range rep.Moves {
				fmt.Fprintf(w, "  bucket %7s %s -> %s  %-7s rows %7d  took %6.0f ms  copy %6.0f ms  pause %6.1f ms\n", fmt.Sprintf("%d/%d", r.Bucket, r.Level), r.Source, r.Target, r.State, r.Stats.RowsCopied, r.ElapsedMS(), r.Stats.CopyMS, r.Stats.PauseMS)
			}
			if len(rep.Phases) > 0 {
				fmt.Fprintf(w, "where the moves' time went: %s\n", migrate.DescribeSummary(rep.Phases))
			}
		}); perr != nil {
			return perr
		}
		return err
	})
}

// abortAfterFailure is `move abort ID --after-failure`: the record and
// what was found and done, as text or, with --json, one object
// {"move": record, "after_failure": report}.
func abortAfterFailure(ctx context.Context, c *cli.Context, mv *migrate.Mover, id string) error {
	rec, rep, err := mv.AbortAfterFailure(ctx, id)
	if rec == nil {
		return err
	}
	perr := cliutil.NewPrinter(c).Emit(map[string]any{"move": rec, "after_failure": rep}, func(w io.Writer) {
		writeMove(w, rec)
		if rep == nil {
			return
		}
		fmt.Fprintf(w, "  owner in the map (version %d): %s, which holds the truth; other node: %s\n", rep.MapVersion, rep.Owner, rep.Other)
		for _, t := range rep.Tables {
			fmt.Fprintf(w, "    %s now: %s %d rows (sum %s), %s %d rows (sum %s)\n", t.Table, rec.Source, t.SourceRows, t.SourceSum, rec.Target, t.TargetRows, t.TargetSum)
		}
		for _, a := range rep.Actions {
			fmt.Fprintf(w, "  %s\n", a)
		}
	})
	if err != nil {
		return err
	}
	return perr
}

// windowNote is the moves table's last column: the rollback window left,
// or what the move has to do with another.
func windowNote(r *topo.MoveRecord) string {
	switch {
	case r.RollbackOf != "":
		return "rolls back " + r.RollbackOf
	case r.State == topo.MoveReversible && r.Reverse != nil && r.Reverse.Until != nil:
		left := max(time.Until(*r.Reverse.Until).Round(time.Second), 0)
		return fmt.Sprintf("%s left", left)
	case r.State == topo.MoveRolledBack && r.Reverse != nil:
		return "rolled back by " + r.Reverse.Rollback
	}
	return ""
}

// describeProbe is the reverse stream's state for writeReverse.
func describeProbe(p *migrate.ReverseProbe) string {
	if p == nil {
		return "started"
	}
	out := p.State
	if p.LagBytes != nil {
		out += fmt.Sprintf(", %d bytes behind", *p.LagBytes)
	}
	if p.Reason != "" {
		out += " (" + p.Reason + ")"
	}
	return out
}
