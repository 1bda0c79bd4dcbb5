package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/schema"
	"github.com/shardvisor/shardvisor/topo"
)

// What the cluster balances (the rebalance record's mode) is changed only
// by an explicit act: `shardctl rebalance mode MODE`, or `rebalance --by
// MODE --set-mode`. A one-off `rebalance --by X` of a cluster that
// balances by another mode is refused: the next rebalance by the recorded
// mode (a running watcher's first) would undo it, and changing the mode
// on the quiet would change what the watcher plans.

// whoSets names a mode change's author for the record: the command and
// the OS user and host it ran as.
func whoSets(command string) string {
	return fmt.Sprintf("%s (%s)", command, schema.Who())
}

// changeMode is rebalance's check of --by against the recorded mode: the
// same, nothing to do; another, refused unless --set-mode records it (and
// says so).
func changeMode(ctx context.Context, c *cli.Context, rb *migrate.Rebalancer, by string) error {
	rec, err := rb.State(ctx)
	if err != nil {
		return err
	}
	if rec.Mode() == by {
		return nil
	}
	if !c.Bool("set-mode") {
		return hint.New(fmt.Errorf("%w: the cluster balances by %s; a rebalance by %s now would be undone by the next rebalance by %s (a running `rebalance --watch` included)", migrate.ErrBalanceMode, rec.Mode(), by, rec.Mode()),
			fmt.Sprintf("`shardctl rebalance --by %s --set-mode` balances by %s from now on (a running watcher follows it, and logs the change); `shardctl rebalance --dry-run --by %s` shows the plan", by, by, by))
	}
	old, err := rb.SetBalanceMode(ctx, by, whoSets("shardctl rebalance --by "+by+" --set-mode"))
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.ErrWriter, "balance mode changed from %s to %s: a running `rebalance --watch` follows it and logs it; %s\n", old, by, migrate.ModeHint(by))
	return nil
}

// modeStatus is the rebalancer's state as status and `rebalance mode`
// show it.
type modeStatus struct {
	Mode    string     `json:"mode"`
	SetBy   string     `json:"set_by,omitempty"`
	SetAt   *time.Time `json:"set_at,omitempty"`
	Paused  bool       `json:"paused"`
	Reason  string     `json:"reason,omitempty"`
	Since   *time.Time `json:"paused_since,omitempty"`
	Watcher string     `json:"watcher_plans"`
	Back    string     `json:"change_with"`
}

func newModeStatus(rec *topo.RebalanceRecord) modeStatus {
	out := modeStatus{Mode: rec.Mode(), Watcher: "moves by bucket count", Back: migrate.ModeHint(rec.Mode())}
	if out.Mode != topo.BalanceCount {
		out.Watcher = "none (it heals unfinished moves); `shardctl rebalance --by " + out.Mode + "` balances by " + out.Mode + ", once"
	}
	if rec != nil {
		out.SetBy, out.SetAt = rec.BySetBy, rec.BySetAt
		if rec.Paused {
			at := rec.At
			out.Paused, out.Reason, out.Since = true, rec.Reason, &at
		}
	}
	return out
}

func writeModeStatus(w io.Writer, s modeStatus) {
	fmt.Fprintf(w, "rebalancer: balances by %s", s.Mode)
	switch {
	case s.SetAt != nil:
		fmt.Fprintf(w, " (set by %s at %s)", s.SetBy, s.SetAt.Local().Format(time.RFC3339))
	case s.Mode != topo.BalanceCount:
		fmt.Fprint(w, " (who set it was not recorded)")
	}
	fmt.Fprintf(w, "; `rebalance --watch` plans %s; %s\n", s.Watcher, s.Back)
	if s.Paused {
		fmt.Fprintf(w, "rebalancer: PAUSED since %s: %s (shardctl rebalance --resume)\n", s.Since.Local().Format(time.RFC3339), s.Reason)
	}
}

// runRebalanceMode is `rebalance mode [MODE]`: show the mode, or set it.
func runRebalanceMode(c *cli.Context) error {
	var want string
	if c.NArg() == 1 {
		m, err := topo.ParseBalanceMode(c.Args().Get(0))
		if err != nil || c.Args().Get(0) == "" {
			return cliutil.Usagef("rebalance mode: want %s, not %q", topo.BalanceModes, c.Args().Get(0))
		}
		want = m
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		mv := migrate.New(st, migrate.Options{Logger: log})
		defer mv.Close()
		rb := migrate.NewRebalancer(mv, bucketmap.Policy{})
		old := ""
		if want != "" {
			var err error
			if old, err = rb.SetBalanceMode(ctx, want, whoSets("shardctl rebalance mode "+want)); err != nil {
				return err
			}
		}
		rec, err := rb.State(ctx)
		if err != nil {
			return err
		}
		s := newModeStatus(rec)
		return cliutil.NewPrinter(c).Emit(s, func(w io.Writer) {
			switch {
			case want != "" && old != want:
				fmt.Fprintf(w, "balance mode changed from %s to %s: a running `rebalance --watch` follows it and logs it\n", old, want)
			case want != "":
				fmt.Fprintf(w, "balance mode already %s: nothing changed\n", want)
			}
			writeModeStatus(w, s)
		})
	})
}

// modeUsage is the mode subcommand's help.
var modeUsage = strings.Join([]string{
	"Without MODE, shows what the cluster balances, who set it and when. With MODE (" + topo.BalanceModes + "), records it:",
	"a plain `rebalance` and `plan` follow it, and a running `rebalance --watch` logs the change and from then on plans",
	"moves by bucket count (count) or none (size, rows: it heals unfinished moves; `rebalance --by MODE` balances once).",
}, "\n")
