package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/schema"
	"github.com/shardvisor/shardvisor/topo"
)

// `shardctl schema`: apply a change to every db node, show the history,
// compare the nodes, start a history (package schema does the work).

func schemaFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: "lock-timeout", Value: 250 * time.Millisecond, Usage: "each attempt's lock_timeout: the longest an application write queues behind the change before it gives way"},
		&cli.IntFlag{Name: "lock-retries", Value: 40, Usage: "attempts after a lock timeout, per node, before the node is left partial"},
		&cli.DurationFlag{Name: "blocker-wait", Value: 30 * time.Second, Usage: "after a lock timeout, how long to wait (queueing nothing) for the transactions that held the lock to end before trying again"},
		&cli.DurationFlag{Name: "wait-moves", Value: 10 * time.Minute, Usage: "how long to wait for moves in flight to finish before giving up"},
		&cli.DurationFlag{Name: "connect-timeout", Value: 10 * time.Second, Usage: "bound on connecting to a db node"},
	}
}

func schemaOptions(c *cli.Context, log *zap.Logger) schema.Options {
	return schema.Options{Canary: c.String("canary"), Parallel: c.Int("parallel"), LockTimeout: c.Duration("lock-timeout"),
		Retries: c.Int("lock-retries"), BlockerWait: c.Duration("blocker-wait"), WaitMoves: c.Duration("wait-moves"), ConnectTimeout: c.Duration("connect-timeout"), Log: log,
		Progress: func(e schema.Event) {
			where := ""
			if e.Node != "" {
				where = "node " + e.Node + ": "
			}
			if e.Change != "" && e.Node != "" {
				where = "node " + e.Node + ", change " + e.Change + ": "
			}
			fmt.Fprintf(c.App.ErrWriter, "%s%s%s\n", time.Now().Format("15:04:05 "), where, e.Message)
		}}
}

func checkSchemaFlags(c *cli.Context) error {
	if c.Duration("lock-timeout") < time.Millisecond {
		return cliutil.Usagef("schema: --lock-timeout must be at least 1ms")
	}
	if c.Int("lock-retries") < 1 {
		return cliutil.Usagef("schema: --lock-retries must be at least 1")
	}
	if c.IsSet("parallel") && c.Int("parallel") < 1 {
		return cliutil.Usagef("schema apply: --parallel must be at least 1")
	}
	return nil
}

func runSchemaApply(c *cli.Context) error {
	if c.NArg() != 1 {
		return cliutil.Usagef("schema apply: want one FILE.sql")
	}
	if err := checkSchemaFlags(c); err != nil {
		return err
	}
	windows := c.String("windows")
	if windows != "close" && windows != "wait" {
		return cliutil.Usagef("schema apply: --windows must be close or wait, not %q", windows)
	}
	file := c.Args().First()
	text, err := os.ReadFile(file)
	if err != nil {
		return cliutil.Usagef("schema apply: %v", err)
	}
	ch, err := schema.Parse(file, string(text))
	if err != nil {
		return err
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		if ch.Mode == topo.ModeStatements {
			fmt.Fprintf(c.App.ErrWriter, "change %s holds %s, which PostgreSQL runs only outside a transaction: each statement runs on its own, and a node's progress is kept by statement\n", ch.ID, ch.NoTx)
		}
		opt := schemaOptions(c, log)
		if windows == "close" {
			mv := migrate.New(st, migrate.Options{Logger: log})
			defer mv.Close()
			opt.CloseWindow = func(ctx context.Context, rec *topo.MoveRecord, why string) error {
				log.Warn("schema apply: closing a move's rollback window: its reverse stream cannot carry the change", zap.String("move", rec.ID), zap.String("why", why))
				_, err := mv.Complete(ctx, rec.ID)
				return err
			}
		}
		if err := pointBefore(ctx, c, st, log, "schema-"+ch.ID); err != nil {
			return err
		}
		res, aerr := schema.Apply(ctx, st, ch, opt)
		if res == nil {
			return aerr
		}
		log.Info("schema apply", zap.String("change", res.ID), zap.String("state", res.State), zap.Strings("missing", res.Missing), zap.Error(aerr))
		if perr := cliutil.NewPrinter(c).Emit(res, func(w io.Writer) { writeApply(w, res) }); perr != nil {
			return perr
		}
		return aerr
	})
}

func writeApply(w io.Writer, r *schema.Result) {
	news := "resumed"
	if r.New {
		news = "recorded"
	}
	fmt.Fprintf(w, "change %s (seq %d, %s, sha256 %.12s, %s): %s\n", r.ID, r.Seq, r.Mode, r.SHA256, news, r.State)
	if r.WaitedMS >= 500 {
		fmt.Fprintf(w, "  waited %s for moves in flight\n", time.Duration(r.WaitedMS*float64(time.Millisecond)).Round(time.Millisecond))
	}
	if len(r.Closed) > 0 {
		fmt.Fprintf(w, "  closed the rollback windows of moves %s first (%s)\n", strings.Join(r.Closed, ", "), r.Why)
	}
	for _, s := range r.Windows {
		errs := ""
		if s.ApplyErrors > 0 {
			errs = fmt.Sprintf(", %d apply errors meanwhile", s.ApplyErrors)
		}
		fmt.Fprintf(w, "  ran beside move %s in its rollback window: reverse stream %s -> %s %s%s\n", s.Move, s.Target, s.Source, s.Stream, errs)
	}
	for _, n := range r.Nodes {
		canary := ""
		if n.Node == r.Canary {
			canary = " (canary)"
		}
		ran := "nothing to run"
		if len(n.Ran) > 0 {
			ran = "ran " + strings.Join(n.Ran, ", ")
		}
		fmt.Fprintf(w, "  %-12s %-11s %s; %d attempts, %d lock timeouts, longest attempt %.1f ms, application statements seen waiting at most %.1f ms%s\n",
			n.Node, n.State, ran, n.Attempts, n.LockTimeouts, n.BlockedMaxMS, n.AppWaitMaxMS, canary)
		if n.Error != "" {
			fmt.Fprintf(w, "  %-12s %s\n", "", n.Error)
		}
		if n.Hint != "" {
			fmt.Fprintf(w, "  %-12s hint: %s\n", "", n.Hint)
		}
	}
	for _, id := range r.Skipped {
		fmt.Fprintf(w, "  %-12s skipped: marked down; `shardctl node prepare %s` brings it in step once it is back\n", id, id)
	}
	if r.State == topo.SchemaFailed {
		fmt.Fprintln(w, "applied nowhere: fix the file and apply it again (a change applied nowhere may take a new text under the same id)")
	} else if len(r.Missing) > 0 {
		fmt.Fprintf(w, "missing on %s: run the same `shardctl schema apply` again once they are fixed or back\n", strings.Join(r.Missing, ", "))
	}
}

// schemaStatus is `schema status --json`.
type schemaStatus struct {
	Changes []schemaStatusChange `json:"changes"`
	Partial []string             `json:"partial"`
	Drift   *topo.SchemaDrift    `json:"drift"`
}

type schemaStatusChange struct {
	Seq       int                               `json:"seq"`
	ID        string                            `json:"id"`
	State     string                            `json:"state"`
	Mode      string                            `json:"mode"`
	SHA256    string                            `json:"sha256"`
	Source    string                            `json:"source"`
	Baseline  bool                              `json:"baseline,omitempty"`
	By        string                            `json:"by"`
	CreatedAt time.Time                         `json:"created_at"`
	Missing   []string                          `json:"missing"`
	Nodes     map[string]*topo.SchemaNodeStatus `json:"nodes"`
	SQL       string                            `json:"sql,omitempty"`
}

func runSchemaStatus(c *cli.Context) error {
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		m, _, err := st.Load(ctx)
		if err != nil {
			return err
		}
		hist, err := topo.ListSchemaChanges(ctx, st.Session(), st.Paths())
		if err != nil {
			return err
		}
		drift, err := topo.ReadSchemaDrift(ctx, st.Session(), st.Paths())
		if err != nil {
			return err
		}
		req := schema.Required(m)
		out := schemaStatus{Changes: []schemaStatusChange{}, Partial: []string{}, Drift: drift}
		for _, h := range hist {
			state, missing := topo.SchemaState(h, req)
			if missing == nil {
				missing = []string{}
			}
			sc := schemaStatusChange{Seq: h.Seq, ID: h.ID, State: state, Mode: h.Mode, SHA256: h.SHA256, Source: h.Source, Baseline: h.Baseline,
				By: h.By, CreatedAt: h.CreatedAt, Missing: missing, Nodes: h.Nodes}
			if c.Bool("sql") {
				sc.SQL = h.SQL
			}
			out.Changes = append(out.Changes, sc)
			// A change that failed on its canary and was applied nowhere
			// holds nothing back: shown, not an error.
			if state != topo.SchemaApplied && !schema.FailedNowhere(h) {
				out.Partial = append(out.Partial, h.ID)
			}
		}
		if err := cliutil.NewPrinter(c).Emit(out, func(w io.Writer) { writeSchemaStatus(w, out) }); err != nil {
			return err
		}
		if len(out.Partial) > 0 {
			return fmt.Errorf("%d changes are not applied on every node: %s", len(out.Partial), strings.Join(out.Partial, ", "))
		}
		return nil
	})
}

func writeSchemaStatus(w io.Writer, s schemaStatus) {
	if len(s.Changes) == 0 {
		fmt.Fprintln(w, "no schema change recorded (`shardctl schema adopt --from NODE` starts the history of an existing cluster; `shardctl schema apply FILE.sql` records the first change)")
	}
	for _, ch := range s.Changes {
		base := ""
		if ch.Baseline {
			base = " baseline"
		}
		fmt.Fprintf(w, "%3d  %-28s %-8s %-11s%s  %s by %s, from %s\n", ch.Seq, ch.ID, ch.State, ch.Mode, base, ch.CreatedAt.Format(time.RFC3339), ch.By, ch.Source)
		if ch.State == topo.SchemaFailed {
			fmt.Fprintf(w, "     failed on its canary and applied nowhere; later changes do not wait for it: fix the file and apply it again (same id), or leave it\n")
		} else if len(ch.Missing) > 0 {
			var why []string
			for _, n := range ch.Missing {
				st := ch.Nodes[n]
				switch {
				case st == nil:
					why = append(why, n+" (not run)")
				case st.Error != "":
					why = append(why, fmt.Sprintf("%s (%s: %s)", n, st.State, st.Error))
				default:
					why = append(why, fmt.Sprintf("%s (%s)", n, st.State))
				}
			}
			fmt.Fprintf(w, "     missing on %s\n", strings.Join(why, "; "))
		}
	}
	if d := s.Drift; d != nil {
		fmt.Fprintf(w, "last diff %s by %s: %d differences (%d blocking moves) over %d nodes\n", d.At.Format(time.RFC3339), d.By, d.Count, d.Blocking, len(d.Nodes))
	}
}

func runSchemaDiff(c *cli.Context) error {
	return withData(c, func(ctx context.Context, d *dataContext) error {
		hist, err := topo.ListSchemaChanges(ctx, d.st.Session(), d.st.Paths())
		if err != nil {
			return err
		}
		res, err := schema.Diff(ctx, d.m, d.rec.Tables, hist, c.String("reference"), c.Duration("connect-timeout"))
		if err != nil {
			return err
		}
		drift := schema.DriftRecord(res, schema.Who())
		if werr := topo.WriteSchemaDrift(ctx, d.st.Session(), d.st.Paths(), drift); werr != nil {
			d.log.Warn("schema diff: recording the result", zap.Error(werr))
		}
		d.log.Info("schema diff", zap.String("reference", res.Reference), zap.Int("differences", len(res.Diffs)), zap.Int("behind", len(res.Behind)), zap.Float64("elapsed_ms", res.ElapsedMS))
		if err := cliutil.NewPrinter(c).Emit(res, func(w io.Writer) { writeDiff(w, res) }); err != nil {
			return err
		}
		switch {
		case res.Drift():
			return fmt.Errorf("schema drift: %d differences between the sharded tables, %d nodes behind the history", len(res.Diffs), len(res.Behind))
		case len(res.Unreachable) > 0:
			return fmt.Errorf("%d nodes could not be compared: %s", len(res.Unreachable), res.Unreachable[0].Node)
		}
		return nil
	})
}

func writeDiff(w io.Writer, r *schema.DiffResult) {
	fmt.Fprintf(w, "compared %d sharded tables on %d nodes with node %s in %.0f ms\n", r.Tables, len(r.Nodes), r.Reference, r.ElapsedMS)
	for _, u := range r.Unreachable {
		fmt.Fprintf(w, "node %s: NOT COMPARED: %s\n", u.Node, u.Error)
	}
	for _, x := range r.Diffs {
		block := ""
		if x.Blocking {
			block = " (blocks moves)"
		}
		fmt.Fprintf(w, "node %s: DIFF %s %s: %s%s\n", x.Nodes[1], x.Kind, x.Table, x.Message, block)
	}
	for _, n := range r.Nodes {
		if b := r.Behind[n]; len(b) > 0 {
			fmt.Fprintf(w, "node %s: BEHIND: lacks recorded changes %s (`shardctl node prepare %s` or `shardctl schema apply` brings it in step)\n", n, strings.Join(b, ", "), n)
		}
	}
	if !r.Drift() {
		fmt.Fprintln(w, "no drift")
	}
}

func runSchemaAdopt(c *cli.Context) error {
	from := c.String("from")
	if from == "" {
		return cliutil.Usagef("schema adopt: --from NODE is required (a node whose schema is the one every node should have)")
	}
	return withData(c, func(ctx context.Context, d *dataContext) error {
		res, err := schema.Adopt(ctx, d.st, bucketmap.NodeID(from), d.rec.Tables, c.String("pg-dump"), schemaOptions(c, d.log))
		if err != nil {
			return err
		}
		d.log.Info("schema adopt", zap.String("from", from), zap.Strings("in_step", res.InStep), zap.Strings("empty", res.Empty))
		if err := cliutil.NewPrinter(c).Emit(res, func(w io.Writer) {
			verb := "already recorded"
			if res.New {
				verb = "recorded"
			}
			fmt.Fprintf(w, "baseline %s from node %s (%d statements, %d bytes)\n", verb, res.From, res.Statements, res.Bytes)
			fmt.Fprintf(w, "in step: %s\n", strings.Join(res.InStep, ", "))
			for _, n := range res.Empty {
				fmt.Fprintf(w, "node %s has no tables: `shardctl node prepare %s` replays the history on it\n", n, n)
			}
			for _, n := range res.Differ {
				fmt.Fprintf(w, "node %s: NOT IN STEP: %s; make it equal by hand, then run adopt again\n", n.Node, n.Error)
			}
			for _, n := range res.Unreachable {
				fmt.Fprintf(w, "node %s: NOT REACHED: %s; run adopt again when it is back\n", n.Node, n.Error)
			}
		}); err != nil {
			return err
		}
		if len(res.Differ)+len(res.Unreachable) > 0 {
			return fmt.Errorf("%d nodes are not marked in step with the baseline", len(res.Differ)+len(res.Unreachable))
		}
		return nil
	})
}
