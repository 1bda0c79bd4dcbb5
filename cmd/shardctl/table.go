package main

import (
	"context"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/topo"
)

// The sharded-table list is in the cluster record (see
// docs/data-contract.md); topo.AddTable and RemoveTable keep its rules.

func runTableAdd(c *cli.Context) error {
	if c.NArg() != 1 {
		return cliutil.Usagef("table add: want SCHEMA.TABLE")
	}
	t := topo.TableRecord{Name: c.Args().First(), KeyColumn: c.String("key")}
	if err := t.Validate(); err != nil {
		return cliutil.Usagef("table add: %v", err)
	}
	return tableEdit(c, "add", t, func(ctx context.Context, st *bucketmap.Store) (*topo.ClusterRecord, error) {
		return topo.AddTable(ctx, st.Session(), st.Paths(), t)
	})
}

func runTableRemove(c *cli.Context) error {
	if c.NArg() != 1 {
		return cliutil.Usagef("table remove: want SCHEMA.TABLE")
	}
	name := c.Args().First()
	return tableEdit(c, "remove", topo.TableRecord{Name: name}, func(ctx context.Context, st *bucketmap.Store) (*topo.ClusterRecord, error) {
		return topo.RemoveTable(ctx, st.Session(), st.Paths(), name)
	})
}

func runTableList(c *cli.Context) error {
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, _ *zap.Logger) error {
		rec, err := topo.ReadCluster(ctx, st.Session(), st.Paths())
		if err != nil {
			return err
		}
		tables := rec.Tables
		if tables == nil {
			tables = []topo.TableRecord{}
		}
		return cliutil.NewPrinter(c).Emit(tables, func(w io.Writer) {
			if len(tables) == 0 {
				fmt.Fprintln(w, "no sharded tables (add one with `shardctl table add SCHEMA.TABLE --key COLUMN`)")
				return
			}
			fmt.Fprintf(w, "%-40s %s\n", "TABLE", "KEY COLUMN")
			for _, t := range tables {
				fmt.Fprintf(w, "%-40s %s\n", t.Name, t.KeyColumn)
			}
		})
	})
}

// tableEdit runs one table change (topo.AddTable or RemoveTable) and
// reports it.
func tableEdit(c *cli.Context, verb string, t topo.TableRecord, edit func(ctx context.Context, st *bucketmap.Store) (*topo.ClusterRecord, error)) error {
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		rec, err := edit(ctx, st)
		if err != nil {
			return fmt.Errorf("table %s %s: %w", verb, t.Name, err)
		}
		log.Info("table "+verb, zap.String("table", t.Name))
		return cliutil.NewPrinter(c).Emit(map[string]any{"action": verb, "table": t.Name, "tables": rec.Tables}, func(w io.Writer) {
			if verb == "add" {
				fmt.Fprintf(w, "table %s (key %s) is sharded; run `shardctl node prepare ID` on every db node to fence it, and `shardctl node check ID` to verify\n", t.Name, t.KeyColumn)
			} else {
				fmt.Fprintf(w, "table %s is no longer sharded; `shardctl node prepare ID` drops its fence trigger\n", t.Name)
			}
		})
	})
}
