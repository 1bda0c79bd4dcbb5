package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/topo"
)

func moveFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: "max-lag", Value: 250 * time.Millisecond, EnvVars: []string{"SHARDVISOR_MOVE_MAX_LAG"}, Usage: "fence only when replication lag (a marker's trip) is below this"},
		&cli.DurationFlag{Name: "pause-cap", Value: 2 * time.Second, EnvVars: []string{"SHARDVISOR_MOVE_PAUSE_CAP"}, Usage: "abort a move whose write pause would exceed this"},
		&cli.DurationFlag{Name: "member-wait", Value: 10 * time.Second, EnvVars: []string{"SHARDVISOR_MOVE_MEMBER_WAIT"}, Usage: "how long to wait for routers and supervisors to apply the moving map"},
		&cli.DurationFlag{Name: "catchup-timeout", Value: 5 * time.Minute, EnvVars: []string{"SHARDVISOR_MOVE_CATCHUP_TIMEOUT"}, Usage: "give up when the lag stays above --max-lag this long"},
	}
}

// withMover connects and hands fn a mover whose progress goes to stderr
// (stdout stays clean for --json).
func withMover(c *cli.Context, fn func(ctx context.Context, mv *migrate.Mover, st *bucketmap.Store) error) error {
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		opts := migrate.Options{Logger: log, MaxLag: c.Duration("max-lag"), PauseCap: c.Duration("pause-cap"),
			MemberWait: c.Duration("member-wait"), CatchupTimeout: c.Duration("catchup-timeout")}
		opts.Progress = func(rec *topo.MoveRecord, msg string) {
			fmt.Fprintf(c.App.ErrWriter, "%s  move %s (bucket %d %s -> %s): %s\n", time.Now().Format("15:04:05.000"), rec.ID, rec.Bucket, rec.Source, rec.Target, msg)
		}
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		return fn(ctx, migrate.New(st, opts), st)
	})
}

func writeMove(w io.Writer, r *topo.MoveRecord) {
	fmt.Fprintf(w, "move %s: bucket %d (level %d) %s -> %s: %s\n", r.ID, r.Bucket, r.Level, r.Source, r.Target, r.State)
	if r.NoCopy {
		fmt.Fprintln(w, "  NO COPY: ownership changed without copying rows (bucket marked data-lost)")
	}
	s := r.Stats
	fmt.Fprintf(w, "  rows copied %d in %.0f ms, lag at fence %.1f ms, write pause %.1f ms\n", s.RowsCopied, s.CopyMS, s.LagAtFenceMS, s.PauseMS)
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
	if r.SlotPending {
		fmt.Fprintf(w, "  slot %s is still on the source (it was unreachable); `shardctl move resume %s` drops it\n", r.Slot, r.ID)
	}
	if r.Error != "" {
		fmt.Fprintf(w, "  error: %s\n", r.Error)
	}
}

func moveCommand() *cli.Command {
	return &cli.Command{
		Name:      "move",
		Usage:     "move one bucket's rows to another db node online",
		ArgsUsage: "BUCKET --to NODE",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "to", Usage: "target db `node`"},
			&cli.BoolFlag{Name: "no-copy", Usage: "only reassign ownership after a short pause; the rows are NOT copied (for data clients can re-create)"},
		}, moveFlags()...),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 || c.String("to") == "" {
				return cliutil.Usagef("move: want BUCKET --to NODE")
			}
			b, err := strconv.ParseUint(c.Args().Get(0), 10, 32)
			if err != nil {
				return cliutil.Usagef("move: bucket %q is not a number", c.Args().Get(0))
			}
			if c.Bool("no-copy") {
				fmt.Fprintf(c.App.ErrWriter, "WARNING: --no-copy: bucket %d's rows will NOT be copied to %s; they stay on the old owner until GC deletes them\n", b, c.String("to"))
			}
			return withMover(c, func(ctx context.Context, mv *migrate.Mover, _ *bucketmap.Store) error {
				rec, err := mv.Move(ctx, uint32(b), bucketmap.NodeID(c.String("to")), c.Bool("no-copy"))
				if rec != nil {
					if perr := cliutil.NewPrinter(c).Emit(rec, func(w io.Writer) { writeMove(w, rec) }); perr != nil {
						return perr
					}
				}
				return err
			})
		},
		Subcommands: []*cli.Command{
			{
				Name: "status", Usage: "show one move", ArgsUsage: "ID",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return cliutil.Usagef("move status: want a move ID")
					}
					return withMover(c, func(ctx context.Context, mv *migrate.Mover, _ *bucketmap.Store) error {
						rec, err := mv.Get(ctx, c.Args().Get(0))
						if err != nil {
							return err
						}
						return cliutil.NewPrinter(c).Emit(rec, func(w io.Writer) {
							writeMove(w, rec)
							for _, st := range rec.Steps {
								fmt.Fprintf(w, "  %s  %s\n", st.At.Format("15:04:05.000"), st.State)
							}
						})
					})
				},
			},
			{
				Name: "resume", Usage: "continue (or roll back) a move whose mover died or whose node was unreachable", ArgsUsage: "ID",
				Flags: moveFlags(),
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return cliutil.Usagef("move resume: want a move ID")
					}
					return withMover(c, func(ctx context.Context, mv *migrate.Mover, _ *bucketmap.Store) error {
						rec, err := mv.Resume(ctx, c.Args().Get(0))
						if rec != nil {
							cliutil.NewPrinter(c).Emit(rec, func(w io.Writer) { writeMove(w, rec) })
						}
						return err
					})
				},
			},
			{
				Name: "abort", Usage: "roll back a move that has not flipped", ArgsUsage: "ID",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return cliutil.Usagef("move abort: want a move ID")
					}
					return withMover(c, func(ctx context.Context, mv *migrate.Mover, _ *bucketmap.Store) error {
						rec, err := mv.Abort(ctx, c.Args().Get(0), "aborted by an operator")
						if rec != nil {
							cliutil.NewPrinter(c).Emit(rec, func(w io.Writer) { writeMove(w, rec) })
						}
						if err != nil && rec != nil && rec.State == topo.MoveAborted {
							return nil
						}
						return err
					})
				},
			},
		},
	}
}

func movesCommand() *cli.Command {
	return &cli.Command{
		Name:  "moves",
		Usage: "list current and past moves",
		Action: func(c *cli.Context) error {
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
					fmt.Fprintf(w, "%-28s %7s %-10s %-10s %-9s %8s %9s %9s  %s\n", "ID", "BUCKET", "FROM", "TO", "STATE", "ROWS", "COPY", "PAUSE", "STARTED")
					for _, r := range list {
						fmt.Fprintf(w, "%-28s %7d %-10s %-10s %-9s %8d %7.0fms %7.1fms  %s\n", r.ID, r.Bucket, r.Source, r.Target, r.State,
							r.Stats.RowsCopied, r.Stats.CopyMS, r.Stats.PauseMS, r.CreatedAt.Local().Format("2006-01-02 15:04:05"))
					}
				})
			})
		},
	}
}

func rebalanceCommand() *cli.Command {
	return &cli.Command{
		Name:  "rebalance",
		Usage: "execute the planner's moves until the map is balanced",
		Description: "Moves one bucket at a time by default (--concurrency K: never two on one node). Stops, and says why, when\n" +
			"a move fails, verification finds a difference (which also pauses it), a node is down, or ZooKeeper is\n" +
			"not connected. --watch is the automatic mode: one elected rebalancer per cluster runs on every map change.",
		Flags: append(append([]cli.Flag{
			&cli.BoolFlag{Name: "dry-run", Usage: "print the plan and change nothing"},
			&cli.BoolFlag{Name: "watch", Usage: "automatic mode: keep running as the cluster's elected rebalancer"},
			&cli.BoolFlag{Name: "resume", Usage: "clear a pause (after a verification mismatch was understood) and run"},
			&cli.BoolFlag{Name: "pause", Usage: "pause the rebalancer (a running one stops after its current moves)"},
		}, policyFlags()...), moveFlags()...),
		Action: func(c *cli.Context) error {
			return withMover(c, func(ctx context.Context, mv *migrate.Mover, st *bucketmap.Store) error {
				rb := migrate.NewRebalancer(mv, policy(c))
				rb.Progress = func(msg string) {
					fmt.Fprintf(c.App.ErrWriter, "%s  rebalance: %s\n", time.Now().Format("15:04:05.000"), msg)
				}
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
					fmt.Fprintf(w, "%d moves, %d splits, %d reassigned without copy; balanced: %v\n", len(rep.Moves), rep.Splits, rep.Reassigned, rep.Balanced)
					for _, r := range rep.Moves {
						fmt.Fprintf(w, "  bucket %5d %s -> %s  %-7s rows %7d  copy %6.0f ms  pause %6.1f ms\n", r.Bucket, r.Source, r.Target, r.State, r.Stats.RowsCopied, r.Stats.CopyMS, r.Stats.PauseMS)
					}
				}); perr != nil {
					return perr
				}
				return err
			})
		},
	}
}
