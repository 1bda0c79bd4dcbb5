// Command pooler is issue 42's connection benchmark: a fleet of prefork
// workers (--workers, 800 by default: 50 web heads × 16), each a process's
// router of its own (router.NewFromFile on the map file, as a worker
// started by the supervisor has) with its own pools, every one connected
// to every db node (--nodes, 4) through the node's PgBouncer in
// transaction mode, writing users at a constant total rate through
// router.Do. It samples each pooler's SHOW POOLS and each server's client
// backends while the load runs, and afterwards checks every acknowledged
// write on its owner and every node's rows against its fence.
//
// It prints, side by side per node: the client connections at the pooler
// against the server connections behind it (goal: at most 50 per node),
// the write errors (goal 0), the rows past the fence (goal 0) and the
// acknowledged writes missing (goal 0); exit status 1 if a goal is missed.
//
//	bench/pooler/run                              # 800 workers, 4 nodes, 400 writes/s for 30 s
//	bench/pooler/run --workers 200 --duration 10s # a quick one
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/pooler"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
)

var (
	workers  = flag.Int("workers", benchkit.EnvInt("SHARDVISOR_BENCH_WORKERS", 800), "worker processes of the fleet, each with a router and pools of its own, connected to every node (env SHARDVISOR_BENCH_WORKERS)")
	nodes    = flag.Int("nodes", benchkit.EnvInt("SHARDVISOR_BENCH_NODES", 4), "db nodes, each a devenv server with its PgBouncer (env SHARDVISOR_BENCH_NODES)")
	rate     = flag.Int("rate", benchkit.EnvInt("SHARDVISOR_BENCH_RATE", 400), "total writes/s the fleet offers (env SHARDVISOR_BENCH_RATE)")
	duration = flag.Duration("duration", benchkit.EnvDuration("SHARDVISOR_BENCH_DURATION", 30*time.Second), "how long the load runs once every worker is connected (env SHARDVISOR_BENCH_DURATION)")
	level    = benchkit.LevelFlag(6, "")
	users    = flag.Int("users", benchkit.EnvInt("SHARDVISOR_BENCH_USERS", 20000), "users the writes pick from (env SHARDVISOR_BENCH_USERS)")
	direct   = flag.Bool("direct", os.Getenv("SHARDVISOR_BENCH_DIRECT") == "1", "the workers connect to the servers directly, past the poolers: the baseline, for a fleet small enough for max_connections (env SHARDVISOR_BENCH_DIRECT=1)")
	devf     = benchkit.NewDevFlags(cliutil.LocalZK)
)

// Goals of issue 42.
const maxServersPerNode = 50

var out = benchkit.NewOut()

func say(format string, args ...any) { out.Say(format, args...) }

// NodeFigures is one node's connections: clients at its pooler against
// server connections behind it, at their peak over the samples.
type NodeFigures struct {
	Node           bucketmap.NodeID `json:"node"`
	Clients        int              `json:"pooler_clients_max"`
	Servers        int              `json:"pooler_servers_max"`
	Waiting        int              `json:"pooler_waiting_max"`
	MaxWaitMS      float64          `json:"pooler_max_wait_ms"`
	ServerLimit    int              `json:"pooler_server_limit"`
	ClientBackends int              `json:"server_client_backends_max"`
	RowsPastFence  int64            `json:"rows_past_fence"`
}

// Summary is the run's figures (--json).
type Summary struct {
	Cores         int           `json:"cores"`
	Workers       int           `json:"workers"`
	Direct        bool          `json:"direct"`
	Nodes         []NodeFigures `json:"nodes"`
	Rate          int           `json:"rate"`
	Seconds       float64       `json:"seconds"`
	ConnectSecs   float64       `json:"connect_seconds"`
	Writes        int64         `json:"writes"`
	Errors        int64         `json:"errors"`
	LastError     string        `json:"last_error,omitempty"`
	WriteMS       benchkit.Stat `json:"write_latency_ms"`
	Missing       int           `json:"missing_acknowledged_writes"`
	RowsPastFence int64         `json:"rows_past_fence"`
	Met           bool          `json:"met"`
	Error         string        `json:"error,omitempty"`
}

func main() {
	out.Parse()
	if *workers < 1 || *nodes < 1 || *rate < 1 || *users < *workers {
		benchkit.Fatalf(2, "pooler-bench", "--workers, --nodes and --rate >= 1; --users >= --workers")
	}
	ctx, stop := benchkit.Context()
	defer stop()
	sum, err := run(ctx)
	benchkit.Finish("pooler-bench", sum, err, func(s *Summary, e string) { s.Error = e }, report, *out.JSON)
	if !sum.Met {
		os.Exit(1)
	}
}

func run(ctx context.Context) (*Summary, error) {
	sum := &Summary{Cores: runtime.NumCPU(), Workers: *workers, Direct: *direct, Rate: *rate}
	start := time.Now()
	db := fmt.Sprintf("svbench_pool_%d", start.Unix())
	root := fmt.Sprintf("/shardvisor-bench/pooler-%d", start.Unix())
	dev, err := clustertest.OpenDev(ctx, clustertest.DevSpec{Dir: *devf.Dir, Lock: !*devf.NoLock, PGHost: *devf.PGHost, PGPortBase: *devf.PGPortBase,
		Nodes: *nodes, DB: db, ZK: *devf.ZK, TLS: *devf.TLS, Pooler: !*direct, Keep: *devf.Keep, Logf: say})
	if err != nil {
		return sum, err
	}
	defer dev.Close()
	dev.DeleteAtClose(topo.MustPaths(root, "pooler"))
	c, err := clustertest.Build(ctx, dev.Session, clustertest.Spec{Root: root, Name: "pooler", Seed: clustertest.Seed, Level: *level,
		Nodes: dev.Nodes, Mapped: *nodes, Tables: []topo.TableRecord{clustertest.KV}, DDL: []string{clustertest.KVDDL}})
	if err != nil {
		return sum, err
	}
	say("cluster at %s: level %d, %d nodes, each through its PgBouncer; database %s", root, *level, *nodes, db)

	// The map file every worker reads, as the supervisor hands it.
	raw, err := bucketmap.EncodeJSON(c.Map)
	if err != nil {
		return sum, err
	}
	file, err := bucketmap.EncodeMapFile("pooler", clustertest.Seed, raw)
	if err != nil {
		return sum, err
	}
	dir, err := os.MkdirTemp("", "shardvisor-poolbench-")
	if err != nil {
		return sum, err
	}
	defer os.RemoveAll(dir)
	mapFile := filepath.Join(dir, "map.json")
	if err := os.WriteFile(mapFile, file, 0o644); err != nil {
		return sum, err
	}

	// The fleet: every worker connects to every node before the load.
	say("starting %d workers, each connecting to the %d nodes through their poolers", *workers, *nodes)
	t0 := time.Now()
	routers := make([]*router.Router, *workers)
	var wg sync.WaitGroup
	errs := make([]error, *workers)
	sem := make(chan struct{}, 64) // connect 64 at a time: a fleet's workers start over seconds, not at once
	for w := range routers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			r, err := router.NewFromFile(mapFile, router.Options{})
			if err != nil {
				errs[w] = err
				return
			}
			routers[w] = r
			for _, n := range dev.Nodes {
				p, err := r.NodePool(ctx, n.ID)
				if err == nil {
					err = p.Ping(ctx)
				}
				if err != nil {
					errs[w] = fmt.Errorf("worker %d, node %s: %w", w, n.ID, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	defer func() {
		for _, r := range routers {
			if r != nil {
				r.Close()
			}
		}
	}()
	for _, err := range errs {
		if err != nil {
			return sum, err
		}
	}
	sum.ConnectSecs = time.Since(t0).Seconds()
	say("  %d workers connected in %.1f s", *workers, sum.ConnectSecs)

	figs := make([]NodeFigures, len(dev.Nodes))
	for i, n := range dev.Nodes {
		figs[i].Node = n.ID
	}
	var figMu sync.Mutex
	sample := func() {
		var swg sync.WaitGroup
		for i, n := range dev.Nodes {
			swg.Add(1)
			go func() {
				defer swg.Done()
				sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				st, err := pooler.ReadNode(sctx, n)
				var backends int
				berr := clientBackends(sctx, dev.Admin[i], db, &backends)
				figMu.Lock()
				defer figMu.Unlock()
				f := &figs[i]
				if err == nil {
					cl, wt, sv := st.Clients()
					f.Clients, f.Waiting, f.Servers = max(f.Clients, cl), max(f.Waiting, wt), max(f.Servers, sv)
					for _, p := range st.Poolers {
						f.ServerLimit = p.ServerLimit
						f.MaxWaitMS = max(f.MaxWaitMS, benchkit.MS(p.MaxWait))
					}
				}
				if berr == nil {
					f.ClientBackends = max(f.ClientBackends, backends)
				}
			}()
		}
		swg.Wait()
	}

	// The load: each worker writes its own users (no two workers write
	// one user), paced so that the fleet offers --rate.
	say("load: %d writes/s in all for %s", *rate, *duration)
	ks := c.Keystream
	interval := time.Duration(float64(time.Second) * float64(*workers) / float64(*rate))
	stopLoad := benchkit.NewStopper()
	acked := make([]map[string]int64, *workers)
	lat := make([][]float64, *workers)
	var writes, failed atomic.Int64
	var lastErr atomic.Pointer[string]
	usersPer := *users / *workers
	loadStart := time.Now()
	for w, r := range routers {
		acked[w] = map[string]int64{}
		stopLoad.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			pace := benchkit.NewPacer(interval)
			// Start the workers' paces spread over one interval.
			time.Sleep(time.Duration(rng.Int64N(int64(interval))))
			var seq int64
			for pace.Wait(stopLoad.C) {
				uid := benchkit.UserID(uint32(rng.IntN(usersPer)**workers + w))
				seq++
				v := seq
				key := keystream.Key(ks.Prefix64(uid))
				wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				t := time.Now()
				err := r.Do(wctx, uid, func(ctx context.Context, pool *pgxpool.Pool, _ router.Route) error {
					_, err := pool.Exec(ctx, clustertest.KVUpsert, key, uid, v)
					return err
				})
				cancel()
				writes.Add(1)
				if err != nil {
					failed.Add(1)
					msg := err.Error()
					lastErr.Store(&msg)
					continue
				}
				lat[w] = append(lat[w], benchkit.MS(time.Since(t)))
				acked[w][uid] = v
			}
		})
	}
	tick := time.NewTicker(time.Second)
	deadline := time.After(*duration)
sampling:
	for {
		select {
		case <-tick.C:
			sample()
		case <-deadline:
			break sampling
		case <-ctx.Done():
			break sampling
		}
	}
	tick.Stop()
	sample()
	stopLoad.Stop()
	sum.Seconds = time.Since(loadStart).Seconds()
	sum.Writes, sum.Errors = writes.Load(), failed.Load()
	if p := lastErr.Load(); p != nil {
		sum.LastError = *p
	}
	var all []float64
	for _, l := range lat {
		all = append(all, l...)
	}
	sum.WriteMS = benchkit.Of(all)

	// Afterwards, directly on each node: no row the node does not own
	// (the fence held through the pooler), and every acknowledged value
	// on its owner.
	onNode := map[bucketmap.NodeID]map[string]int64{}
	for i, n := range dev.Nodes {
		cfg, err := pgx.ParseConfig(dev.Admin[i])
		if err != nil {
			return sum, err
		}
		cfg.Database = db
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return sum, fmt.Errorf("%s: %w", n.ID, err)
		}
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM app.kv WHERE NOT shardvisor.owns(bkey)`).Scan(&figs[i].RowsPastFence); err != nil {
			conn.Close(ctx)
			return sum, fmt.Errorf("%s: rows past the fence: %w", n.ID, err)
		}
		sum.RowsPastFence += figs[i].RowsPastFence
		rows, err := conn.Query(ctx, `SELECT uid, v FROM app.kv`)
		if err != nil {
			conn.Close(ctx)
			return sum, err
		}
		m := map[string]int64{}
		for rows.Next() {
			var uid string
			var v int64
			if err := rows.Scan(&uid, &v); err != nil {
				conn.Close(ctx)
				return sum, err
			}
			m[uid] = v
		}
		rows.Close()
		conn.Close(ctx)
		onNode[n.ID] = m
	}
	for w := range acked {
		for uid, v := range acked[w] {
			rt, err := routers[w].Route(uid)
			if err != nil {
				return sum, err
			}
			if onNode[rt.Node][uid] != v {
				sum.Missing++
			}
		}
	}
	sum.Nodes = figs
	sum.Met = sum.Errors == 0 && sum.RowsPastFence == 0 && sum.Missing == 0 && sum.Writes > 0
	for _, f := range figs {
		sum.Met = sum.Met && (*direct || f.Clients >= *workers && f.Servers <= maxServersPerNode)
	}
	return sum, nil
}

// clientBackends counts the server's client backends on database db.
func clientBackends(ctx context.Context, admin, db string, n *int) error {
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND datname = $1`, db).Scan(n)
}

func report(s *Summary) {
	via := "through PgBouncer (transaction mode)"
	if s.Direct {
		via = "DIRECTLY to the servers (the baseline)"
	}
	say("\nconnection benchmark (issue 42): %d workers, each with a router and pools of its own, on %d nodes %s; %d writes/s for %.0f s, %d cores",
		s.Workers, len(s.Nodes), via, s.Rate, s.Seconds, s.Cores)
	say("  %-6s %12s %12s %10s %12s %14s %10s", "node", "clients", "servers", "waiting", "wait (ms)", "backends (db)", "past fence")
	nodes := append([]NodeFigures(nil), s.Nodes...)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Node < nodes[j].Node })
	for _, f := range nodes {
		say("  %-6s %12d %9d/%-2d %10d %12.1f %14d %10d", f.Node, f.Clients, f.Servers, f.ServerLimit, f.Waiting, f.MaxWaitMS, f.ClientBackends, f.RowsPastFence)
	}
	say("  (peaks over one sample a second: clients at the pooler, its server connections against its limit, clients waiting for one; the server's client backends on the database)")
	say("  writes: %d, errors %d%s; latency ms %s", s.Writes, s.Errors, map[bool]string{true: " (last: " + s.LastError + ")", false: ""}[s.LastError != ""], s.WriteMS.MS())
	say("  goals: every node's pooler holds all %d workers' connections and at most %d server connections; 0 errors; 0 rows past the fence (%d); 0 acknowledged writes missing (%d): %s",
		s.Workers, maxServersPerNode, s.RowsPastFence, s.Missing, benchkit.Verdict(s.Met))
}
