package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/migrate"
)

// The registry side of `shardctl node`: each command is one change of the
// map's node registry (nodeEdit), and says what it did.

func runNodeAdd(c *cli.Context) error {
	if c.NArg() != 2 {
		return cliutil.Usagef("node add: want ID DSN")
	}
	n := bucketmap.Node{ID: bucketmap.NodeID(c.Args().Get(0)), DSN: c.Args().Get(1), PoolDSN: c.String("pool-dsn"), Password: c.String("password"), StreamUser: c.String("stream-user"),
		Weight: c.Int("weight"), State: bucketmap.NodeActive, Patroni: patroniFlags(c)}
	if err := bucketmap.ValidateNode(n); err != nil {
		return cliutil.Usagef("node add: %v", err)
	}
	return nodeEdit(c, "add", n.ID, func(m *bucketmap.Map) (string, error) {
		return fmt.Sprintf("node %s added (weight %d%s); `shardctl plan` shows the moves that give it buckets", n.ID, n.Weight, groupNote(n)), m.AddNode(n)
	})
}

// runNodeSetDSN changes how a node is reached (its DSN, pooler, password
// reference and Patroni group), for instance when a plain node becomes a
// Patroni group.
func runNodeSetDSN(c *cli.Context) error {
	if c.NArg() != 2 {
		return cliutil.Usagef("node set-dsn: want ID DSN")
	}
	id := bucketmap.NodeID(c.Args().Get(0))
	n := bucketmap.Node{ID: id, DSN: c.Args().Get(1), PoolDSN: c.String("pool-dsn"), Password: c.String("password"), StreamUser: c.String("stream-user"), Weight: 1, State: bucketmap.NodeActive, Patroni: patroniFlags(c)}
	if err := bucketmap.ValidateNode(n); err != nil {
		return cliutil.Usagef("node set-dsn: %v", err)
	}
	if c.Bool("no-patroni") && c.IsSet("patroni-scope") {
		return cliutil.Usagef("node set-dsn: --no-patroni and --patroni-scope contradict each other")
	}
	return nodeEdit(c, "set-dsn", id, func(m *bucketmap.Map) (string, error) {
		old, ok := m.Node(id)
		if ok && !c.IsSet("password") {
			n.Password = old.Password
		}
		if ok && !c.IsSet("stream-user") {
			n.StreamUser = old.StreamUser
		}
		if ok && !c.IsSet("pool-dsn") {
			n.PoolDSN = old.PoolDSN
		}
		// The group stays unless the command says otherwise: adding a
		// member to a group's DSN must not turn it into a plain node.
		if ok && !c.IsSet("patroni-scope") && !c.Bool("no-patroni") {
			n.Patroni = old.Patroni
		}
		return fmt.Sprintf("node %s is reached at %s%s%s; routers and workers reconnect as they apply the map", id, n.DSN, poolNote(n), groupNote(n)), m.SetConnection(id, n)
	})
}

// patroniFlags reads --patroni-scope and --patroni-namespace: no scope,
// no group.
func patroniFlags(c *cli.Context) bucketmap.Patroni {
	if c.String("patroni-scope") == "" {
		return bucketmap.Patroni{}
	}
	return bucketmap.Patroni{Namespace: c.String("patroni-namespace"), Scope: c.String("patroni-scope")}
}

func poolNote(n bucketmap.Node) string {
	if n.PoolDSN == "" {
		return " (applications too: no pooler)"
	}
	return ", applications through the pooler at " + n.PoolDSN
}

func groupNote(n bucketmap.Node) string {
	if n.Patroni.IsZero() {
		return ""
	}
	return fmt.Sprintf(", Patroni group %s under %s", n.Patroni.Scope, n.Patroni.Namespace)
}

func drainNode(m *bucketmap.Map, id bucketmap.NodeID) (string, error) {
	return fmt.Sprintf("node %s is draining; it still owns %d buckets until the moves run", id, m.Counts()[id]), m.Drain(id)
}

func downNode(m *bucketmap.Map, id bucketmap.NodeID) (string, error) {
	re, err := m.MarkDown(id)
	return fmt.Sprintf("node %s is down; %d buckets reassigned WITHOUT copying (marked data-lost)", id, len(re)), err
}

func upNode(m *bucketmap.Map, id bucketmap.NodeID) (string, error) {
	return fmt.Sprintf("node %s is active", id), m.Activate(id)
}

func removeNode(m *bucketmap.Map, id bucketmap.NodeID) (string, error) {
	return fmt.Sprintf("node %s removed", id), m.RemoveNode(id)
}

func runNodeSetWeight(c *cli.Context) error {
	if c.NArg() != 2 {
		return cliutil.Usagef("node set-weight: want ID WEIGHT")
	}
	w, err := strconv.Atoi(c.Args().Get(1))
	if err != nil || w < 1 || w > bucketmap.MaxWeight {
		return cliutil.Usagef("node set-weight: weight %q is not a number in 1..%d", c.Args().Get(1), bucketmap.MaxWeight)
	}
	id := bucketmap.NodeID(c.Args().Get(0))
	return nodeEdit(c, "set-weight", id, func(m *bucketmap.Map) (string, error) {
		return fmt.Sprintf("node %s weight %d", id, w), m.SetWeight(id, w)
	})
}

// oneNode is the Action of a command that takes one node ID and applies
// edit to it (node drain, down, up, remove).
func oneNode(edit func(m *bucketmap.Map, id bucketmap.NodeID) (string, error)) cli.ActionFunc {
	return func(c *cli.Context) error {
		verb := c.Command.Name
		if c.NArg() != 1 {
			return cliutil.Usagef("node %s: want one node ID", verb)
		}
		id := bucketmap.NodeID(c.Args().Get(0))
		if verb == "remove" {
			if err := withStore(c, func(ctx context.Context, st *bucketmap.Store, _ *zap.Logger) error {
				using, err := migrate.MovesUsing(ctx, st, id)
				if err == nil && len(using) > 0 {
					r := using[0]
					err = hint.New(fmt.Errorf("node remove %s: move %s (bucket %d, %s -> %s, %s) still needs it; finish it first", id, r.ID, r.Bucket, r.Source, r.Target, r.State),
						fmt.Sprintf("shardctl move resume %s, or shardctl move complete %s in its rollback window", r.ID, r.ID))
				}
				return err
			}); err != nil {
				return err
			}
		}
		return nodeEdit(c, verb, id, func(m *bucketmap.Map) (string, error) { return edit(m, id) })
	}
}

// nodeEdit applies one registry change by compare-and-swap and reports it.
func nodeEdit(c *cli.Context, verb string, id bucketmap.NodeID, edit func(m *bucketmap.Map) (string, error)) error {
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		var msg string
		res, err := owners(c, st).Change(ctx, func(m *bucketmap.Map) error {
			var err error
			msg, err = edit(m)
			return err
		})
		if err != nil {
			return fmt.Errorf("node %s %s: %w", verb, id, err)
		}
		printDrift(c, res)
		m := res.Map
		log.Info("node "+verb, zap.String("node", string(id)), zap.Uint64("map_version", m.Version))
		n, _ := m.Node(id)
		return cliutil.NewPrinter(c).Emit(map[string]any{"node": id, "action": verb, "state": n.State, "buckets": m.Counts()[id], "map_version": m.Version},
			func(w io.Writer) { fmt.Fprintf(w, "%s (map version %d)\n", msg, m.Version) })
	})
}
