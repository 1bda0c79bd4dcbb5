package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/pooler"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// withStore connects and hands fn the cluster's map store.
func withStore(c *cli.Context, fn func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error) error {
	log, err := cliutil.Logger(c)
	if err != nil {
		return err
	}
	s, paths, err := cliutil.Connect(c, log)
	if err != nil {
		return err
	}
	defer s.Close()
	return fn(c.Context, bucketmap.NewStore(s, paths), log)
}

// policy is the planner policy that policyFlags set.
func policy(c *cli.Context) bucketmap.Policy {
	return bucketmap.Policy{Concurrency: c.Int("concurrency"), AutoSplit: c.Bool("auto-split"), MinBucketsPerNode: c.Int("min-buckets-per-node")}
}

func runInit(c *cli.Context) error {
	level := c.Int("level")
	if level < 0 || level > bucketmap.MaxLevel {
		return cliutil.Usagef("init: --level %d out of range 0..%d", level, bucketmap.MaxLevel)
	}
	var seed keystream.Seed
	switch {
	case c.IsSet("seed") && c.Bool("random-seed"):
		return cliutil.Usagef("init: give --seed or --random-seed, not both")
	case c.IsSet("seed"):
		var err error
		if seed, err = keystream.ParseSeed(c.String("seed")); err != nil {
			return cliutil.Usagef("init: --seed: %v", err)
		}
	case c.Bool("random-seed"):
		seed = make([]byte, 32)
		if _, err := rand.Read(seed); err != nil {
			return err
		}
	default:
		return cliutil.Usagef("init: --seed HEX or --random-seed is required")
	}
	nodes, err := initNodes(c)
	if err != nil {
		return err
	}
	m, err := bucketmap.New(level, nodes, time.Now().UTC())
	if err != nil {
		return cliutil.Usagef("init: %v", err)
	}
	admin, err := zksession.LoadCredential(c.String(cliutil.FlagZKAuth), c.String(cliutil.FlagZKAuthFile))
	if err != nil {
		return cliutil.Usagef("init: %v", err)
	}
	reader, err := zksession.LoadCredential(c.String("reader-auth"), c.String("reader-auth-file"))
	if err != nil {
		return cliutil.Usagef("init: reader identity: %v", err)
	}
	if reader != nil && admin == nil {
		return cliutil.Usagef("init: --reader-auth needs an admin identity too (--zk-auth or --zk-auth-file)")
	}
	x509Admin := c.Bool("x509-admin")
	if x509Admin && (admin != nil || reader != nil) {
		return cliutil.Usagef("init: --x509-admin makes this certificate's identity the admin; give it without --zk-auth and --reader-auth")
	}
	if x509Admin && c.String(cliutil.FlagZKTLSCert) == "" {
		return cliutil.Usagef("init: --x509-admin needs ZooKeeper over TLS with this operator's certificate (--zk-tls-ca, --zk-tls-cert, --zk-tls-key)")
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, _ *zap.Logger) error {
		rec := topo.ClusterRecord{Version: topo.ClusterVersion, Name: st.Paths().ClusterName(), Seed: seed.String(), CreatedAt: time.Now().UTC()}
		opt := bucketmap.CreateOptions{ACL: zksession.ClusterACL(admin, reader)}
		adminName := ""
		if admin != nil {
			adminName = admin.String()
		}
		if x509Admin {
			dn := st.Session().Identity() // set from --zk-tls-cert
			opt.ACL, adminName = zksession.X509ClusterACL(dn), "x509:"+dn
		}
		res, err := owners(c, st).Create(ctx, rec, m, opt)
		if err != nil {
			return err
		}
		printDrift(c, res)
		out := map[string]any{"cluster": rec.Name, "path": st.Paths().Cluster(), "level": m.Level, "buckets": m.Buckets(),
			"map_version": m.Version, "nodes": m.Summarize().Nodes, "acl": adminName != ""}
		return cliutil.NewPrinter(c).Emit(out, func(w io.Writer) {
			fmt.Fprintf(w, "created cluster %s at %s: level %d (%d buckets), %d db nodes, %d-byte seed\n",
				rec.Name, st.Paths().Cluster(), m.Level, m.Buckets(), len(nodes), len(seed))
			if adminName != "" {
				fmt.Fprintf(w, "writes need %s\n", adminName)
			}
			bucketmap.WriteSummary(w, m.Summarize())
		})
	})
}

func runStatus(c *cli.Context) error {
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, _ *zap.Logger) error {
		m, _, err := st.Load(ctx)
		if err != nil {
			return err
		}
		rec, err := topo.ReadRebalance(ctx, st.Session(), st.Paths())
		if err != nil {
			return err
		}
		out := struct {
			bucketmap.Summary
			// Groups: the Patroni groups among the nodes, as their
			// records in ZooKeeper say now.
			Groups map[bucketmap.NodeID]*topo.PatroniView `json:"groups,omitempty"`
			// Rebalance: what the rebalancer balances, who set it, and
			// whether it is paused.
			Rebalance modeStatus `json:"rebalance"`
			// Pools: the poolers of the nodes that have one, as their
			// admin consoles say now.
			Pools map[bucketmap.NodeID]*pooler.NodeView `json:"pools,omitempty"`
		}{Summary: m.Summarize(), Groups: readGroups(ctx, st.Session(), m), Rebalance: newModeStatus(rec), Pools: readPools(ctx, m)}
		return cliutil.NewPrinter(c).Emit(out, func(w io.Writer) {
			fmt.Fprintf(w, "cluster %s (%s)\n", st.Paths().ClusterName(), st.Paths().Cluster())
			bucketmap.WriteSummary(w, out.Summary)
			writeModeStatus(w, out.Rebalance)
			for _, n := range m.Nodes() {
				if g := out.Groups[n.ID]; g != nil {
					writeGroup(w, n.ID, g)
				}
			}
			writePools(w, out.Pools)
			if c.Bool("grid") {
				fmt.Fprintln(w)
				m.Grid(w, c.Int("rows"))
			}
		})
	})
}

func runSplit(c *cli.Context) error {
	if c.NArg() == 1 {
		return runSplitBucket(c)
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		// The rollback of a bucket the map has split cannot run.
		if held, err := migrate.InWindow(ctx, st); err != nil {
			return err
		} else if len(held) > 0 {
			return hint.New(fmt.Errorf("move %s (bucket %d/%d) is in its rollback window; a split waits until it ends", held[0].ID, held[0].Bucket, held[0].Level),
				fmt.Sprintf("shardctl move complete %s (or shardctl move rollback %s)", held[0].ID, held[0].ID))
		}
		res, err := owners(c, st).Split(ctx, 1)
		if err != nil {
			return err
		}
		printDrift(c, res)
		m := res.Map
		log.Info("split", zap.Int("level", m.Level), zap.Uint64("map_version", m.Version))
		return cliutil.NewPrinter(c).Emit(map[string]any{"level": m.Level, "buckets": m.Buckets(), "map_version": m.Version}, func(w io.Writer) {
			if m.Uniform() {
				fmt.Fprintf(w, "split to level %d (%d buckets), map version %d\n", m.Level, m.Buckets(), m.Version)
			} else {
				fmt.Fprintf(w, "split every bucket one level deeper: depths %d..%d (%d buckets), map version %d\n", m.MinDepth(), m.Level, m.Buckets(), m.Version)
			}
		})
	})
}

// runSplitBucket splits one bucket. A move of its keys that has not
// finished (copying, or in its rollback window) would find its bucket gone
// and abort, or could not roll back: the split waits for it.
func runSplitBucket(c *cli.Context) error {
	b, err := bucketmap.ParseBucket(c.Args().Get(0))
	if err != nil {
		return cliutil.Usagef("split: %v", err)
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		m, _, err := st.Load(ctx)
		if err != nil {
			return err
		}
		r, err := m.Resolve(b)
		if err != nil {
			return err
		}
		busy, err := migrate.MovesOf(ctx, st, r)
		if err != nil {
			return err
		}
		if len(busy) > 0 {
			mv := busy[0]
			return hint.New(fmt.Errorf("bucket %s has an unfinished move %s (%s); a split of it waits until the move ends", m.Name(r), mv.ID, mv.State),
				fmt.Sprintf("shardctl move status %s (in its rollback window: shardctl move complete %s)", mv.ID, mv.ID))
		}
		res, err := owners(c, st).SplitBucket(ctx, r)
		if err != nil {
			return err
		}
		printDrift(c, res)
		m = res.Map
		h0, h1 := r.Halves()
		log.Info("split bucket", zap.String("bucket", r.String()), zap.Int("min_depth", m.MinDepth()), zap.Int("max_depth", m.Level), zap.Uint64("map_version", m.Version))
		out := map[string]any{"split": r, "halves": []bucketmap.Bucket{h0, h1}, "owner": m.OwnerOf(h0), "buckets": m.Buckets(),
			"min_depth": m.MinDepth(), "max_depth": m.Level, "map_version": m.Version}
		return cliutil.NewPrinter(c).Emit(out, func(w io.Writer) {
			fmt.Fprintf(w, "split bucket %s into %s and %s on %s (no data moves); %d buckets at depths %d..%d, map version %d\n",
				r, h0, h1, m.OwnerOf(h0), m.Buckets(), m.MinDepth(), m.Level, m.Version)
		})
	})
}

func runPlan(c *cli.Context) error {
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, _ *zap.Logger) error {
		return printPlan(ctx, c, st)
	})
}

// printPlan prints the planner's answer for the live map, changing nothing.
func printPlan(ctx context.Context, c *cli.Context, st *bucketmap.Store) error {
	m, _, err := st.Load(ctx)
	if err != nil {
		return err
	}
	by, err := recordedBy(ctx, c, st)
	if err != nil {
		return err
	}
	if sp, err := sizePolicyFor(c, by); err != nil {
		return err
	} else if sp != nil {
		opt, err := sizingOptions(c)
		if err != nil {
			return err
		}
		p, meas, err := migrate.PlanBySize(ctx, st, m, *sp, opt)
		if err != nil {
			return err
		}
		return cliutil.NewPrinter(c).Emit(sizePlanOut{p, meas.Nodes}, func(w io.Writer) { writeSizePlan(w, m, p, meas) })
	}
	p, err := bucketmap.PlanFor(m, policy(c))
	if err != nil {
		return err
	}
	return cliutil.NewPrinter(c).Emit(p, func(w io.Writer) { writePlan(w, m, p, policy(c)) })
}

func writePlan(w io.Writer, m *bucketmap.Map, p *bucketmap.Plan, pol bucketmap.Policy) {
	// Buckets at the plan's level (after its splits) of a map at one
	// depth keep their bare numbers.
	name := func(b bucketmap.Bucket) string {
		if m.Uniform() && b.Depth == p.Level {
			return fmt.Sprint(b.Prefix)
		}
		return b.String()
	}
	fmt.Fprintf(w, "plan for map version %d: ", p.MapVersion)
	if p.Splits > 0 {
		fmt.Fprintf(w, "split %d time(s) to level %d, then ", p.Splits, p.Level)
	}
	fmt.Fprintf(w, "%d reassignments without copy, %d moves (lower bound %d)\n", len(p.Reassign), len(p.Moves), p.LowerBound)
	for _, mv := range p.Reassign {
		fmt.Fprintf(w, "  reassign bucket %s: %s (down) -> %s\n", name(mv.Bucket), mv.From, mv.To)
	}
	for i, mv := range p.Moves {
		if i == 50 {
			fmt.Fprintf(w, "  ... %d more (see --json)\n", len(p.Moves)-50)
			break
		}
		fmt.Fprintf(w, "  move bucket %s: %s -> %s\n", name(mv.Bucket), mv.From, mv.To)
	}
	if len(p.Moves) > 0 {
		fmt.Fprintf(w, "first wave at concurrency %d: %d move(s)\n", max(1, pol.Concurrency), len(bucketmap.Schedule(p.Moves, nil, pol.Concurrency)))
	}
}

func runAssign(c *cli.Context) error {
	if c.NArg() != 2 {
		return cliutil.Usagef("assign: want BUCKET NODE, got %d arguments", c.NArg())
	}
	b, err := bucketmap.ParseBucket(c.Args().Get(0))
	if err != nil {
		return cliutil.Usagef("assign: %v", err)
	}
	to := bucketmap.NodeID(c.Args().Get(1))
	if !c.Bool("no-copy") {
		return cliutil.Usagef("assign: without --no-copy the rows would have to be copied; use `shardctl move %s --to %s` for that, or --no-copy to reassign without copying", c.Args().Get(0), to)
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		from, res, err := owners(c, st).Assign(ctx, b, to, bucketmap.AssignOptions{NoCopy: true, Force: c.Bool("force")})
		if err != nil {
			return err
		}
		printDrift(c, res)
		m := res.Map
		if b.Depth == bucketmap.AtLevel {
			b.Depth = m.Level
		}
		log.Warn("bucket reassigned without copying", zap.String("bucket", b.String()), zap.String("from", string(from)), zap.String("to", string(to)))
		return cliutil.NewPrinter(c).Emit(map[string]any{"bucket": b.Prefix, "level": b.Depth, "from": from, "to": to, "map_version": m.Version, "data_lost": true}, func(w io.Writer) {
			fmt.Fprintf(w, "bucket %s: %s -> %s WITHOUT copying its rows (marked data-lost), map version %d\n", m.Name(b), from, to, m.Version)
		})
	})
}

func runSimulate(c *cli.Context) error {
	var events []bucketmap.SimEvent
	for _, a := range c.Args().Slice() {
		e, err := bucketmap.ParseSimEvent(a)
		if err != nil {
			return cliutil.Usagef("simulate: %v", err)
		}
		events = append(events, e)
	}
	if len(events) == 0 {
		return cliutil.Usagef("simulate: give at least one event, e.g. add:n4 down:n2 drain:n3")
	}
	run := func(start *bucketmap.Map) error {
		steps, final, err := bucketmap.Simulate(start, events, policy(c))
		out := cliutil.NewPrinter(c)
		if perr := out.Emit(map[string]any{"steps": steps, "final": final.Summarize()}, func(w io.Writer) {
			fmt.Fprintf(w, "start: %s (%d buckets), %d nodes\n", depths(start.MinDepth(), start.Level), start.Buckets(), len(start.Nodes()))
			fmt.Fprintf(w, "%-20s %6s %8s %6s %10s %6s %11s\n", "EVENT", "LEVEL", "BUCKETS", "SPLITS", "REASSIGNED", "MOVES", "LOWER-BOUND")
			for _, s := range steps {
				lv := fmt.Sprint(s.Level)
				if s.MinDepth != s.Level {
					lv = fmt.Sprintf("%d..%d", s.MinDepth, s.Level)
				}
				fmt.Fprintf(w, "%-20s %6s %8d %6d %10d %6d %11d\n", s.Event, lv, s.Buckets, s.Splits, s.Reassigned, s.Moves, s.LowerBound)
			}
			fmt.Fprintln(w, "final balance:")
			bucketmap.WriteSummary(w, final.Summarize())
		}); perr != nil {
			return perr
		}
		return err
	}
	if c.Bool("live") {
		return withStore(c, func(ctx context.Context, st *bucketmap.Store, _ *zap.Logger) error {
			m, _, err := st.Load(ctx)
			if err != nil {
				return err
			}
			return run(m)
		})
	}
	var nodes []bucketmap.Node
	for _, spec := range strings.Split(c.String("nodes"), ",") {
		id, w, hasW := strings.Cut(strings.TrimSpace(spec), "=")
		weight := 1
		if hasW {
			n, err := strconv.Atoi(w)
			if err != nil {
				return cliutil.Usagef("simulate: --nodes %q: weight %q is not a number", spec, w)
			}
			weight = n
		}
		nodes = append(nodes, bucketmap.SimNode(bucketmap.NodeID(id), weight))
	}
	m, err := bucketmap.New(c.Int("level"), nodes, time.Now().UTC())
	if err != nil {
		return cliutil.Usagef("simulate: %v", err)
	}
	return run(m)
}

// initNodes reads init's --node values (or SHARDVISOR_NODES): one node
// per ID=DSN, a DSN's own commas (a multi-host DSN) kept in it.
func initNodes(c *cli.Context) ([]bucketmap.Node, error) {
	specs := cliutil.SplitNodes(c.StringSlice("node"))
	if len(specs) == 0 {
		return nil, cliutil.Usagef("init: at least one --node ID=DSN is required")
	}
	pools := map[string]string{}
	for _, spec := range cliutil.SplitNodes(c.StringSlice("pool")) {
		id, dsn, ok := strings.Cut(spec, "=")
		if !ok {
			return nil, cliutil.Usagef("init: --pool %q: want ID=DSN", spec)
		}
		pools[id] = dsn
	}
	var nodes []bucketmap.Node
	for _, spec := range specs {
		id, dsn, ok := strings.Cut(spec, "=")
		if !ok {
			return nil, cliutil.Usagef("init: --node %q: want ID=DSN", spec)
		}
		n := bucketmap.Node{ID: bucketmap.NodeID(id), DSN: dsn, PoolDSN: pools[id], Password: c.String("password"), StreamUser: c.String("stream-user"), Weight: 1, State: bucketmap.NodeActive}
		delete(pools, id)
		if err := bucketmap.ValidateNode(n); err != nil {
			return nil, cliutil.Usagef("init: --node: %v", err)
		}
		nodes = append(nodes, n)
	}
	if len(pools) > 0 {
		id := slices.Sorted(maps.Keys(pools))[0]
		return nil, cliutil.Usagef("init: --pool %s=...: there is no --node %s", id, id)
	}
	return nodes, nil
}

// depths names a map's depths for people: "level 4", or "depths 2..5".
func depths(lo, hi int) string {
	if lo == hi {
		return fmt.Sprintf("level %d", hi)
	}
	return fmt.Sprintf("depths %d..%d", lo, hi)
}
