// Command mapprop-bench measures map propagation: the bytes ZooKeeper sends
// a fleet of watchers (routers on their own sessions) for one bucket-map
// change, and the time until every watcher applied it, with the record
// stored plain (the baseline) and gzip-compressed, side by side in one run.
// Run it with bench/mapprop/run; docs/bucket-map.md ("Measured: map
// propagation") says what each figure means.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

var (
	level     = benchkit.LevelFlag(16, "")
	nodeCount = flag.Int("nodes", 100, "db nodes in the map")
	watchers  = flag.Int("watchers", 100, "routers following the map, each on its own ZooKeeper session")
	changes   = flag.Int("changes", 20, "map changes per encoding (rounded up to even: a move is two changes)")
	layout    = flag.String("layout", "grown", "how the buckets are spread: grown (a cluster grown from 10 nodes one join at a time by the planner), fresh (shardctl init's contiguous runs) or shuffled (every bucket's owner at random: the worst case for compression)")
	timeout   = flag.Duration("timeout", 30*time.Second, "how long to wait for every watcher to apply one change")
	zkConnect = flag.String("zk", cliutil.LocalZK, "ZooKeeper connect string")
	noLock    = flag.Bool("no-lock", false, "do not take the test environment's shared lock")
	devenvDir = flag.String("devenv-dir", benchkit.EnvOr("SHARDVISOR_DEVENV_DIR", benchkit.DefaultDevenvDir), "scripts/devenv state directory (its lock)")
)

const (
	clusterNm = "mapprop"
	seedHex   = "6d61702d70726f7061676174696f6e2d62656e6368" // "map-propagation-bench"
	target    = 1000.0                                       // ms: every watcher applies a change within 1 s, p99
)

// out prints the report: on stdout, or stderr with --json.
var out = benchkit.NewOut()

func main() {
	out.Parse()
	if *level < 1 || *level > bucketmap.MaxLevel || *nodeCount < 2 || *watchers < 1 || *changes < 1 {
		benchkit.Fatalf(2, "mapprop-bench", "--level 1..%d, --nodes >= 2, --watchers and --changes >= 1", bucketmap.MaxLevel)
	}
	*changes += *changes % 2
	ctx, stop := benchkit.Context()
	defer stop()
	sum, err := run(ctx, []bucketmap.MapEncoding{bucketmap.MapPlain, bucketmap.MapGzip}) // plain is the baseline
	benchkit.Finish("mapprop-bench", sum, err, func(s *Summary, e string) { s.Error = e }, report, *out.JSON)
}

func run(ctx context.Context, encs []bucketmap.MapEncoding) (*Summary, error) {
	root := fmt.Sprintf("/shardvisor-bench/mapprop-%d", time.Now().Unix())
	sum := &Summary{Cores: runtime.NumCPU(), Level: *level, Buckets: 1 << *level, Nodes: *nodeCount, Layout: *layout,
		Watchers: *watchers, Members: true, ChangesPerEnc: *changes, ZKRoot: root}
	if !*noLock {
		os.Setenv("SHARDVISOR_DEVENV_DIR", *devenvDir)
		t := time.Now()
		release, err := testenv.Share()
		sum.LockSeconds = time.Since(t).Seconds()
		if sum.LockSeconds > 1 {
			out.Say("waited %.0f s for the test environment's shared lock (a disruptive test held it)", sum.LockSeconds)
		}
		if err != nil {
			return nil, fmt.Errorf("test environment lock (in %s): %w", *devenvDir, err)
		}
		defer release()
	}

	m, err := buildMap(time.Now().UTC())
	if err != nil {
		return nil, err
	}
	for _, e := range encs {
		c := m.Clone()
		c.Encoding = e
		data, err := bucketmap.Encode(c)
		if err != nil {
			return nil, err
		}
		js, _ := bucketmap.EncodeJSON(c)
		side := &Side{Encoding: string(e), RecordBytes: len(data), PlainBytes: len(js)}
		if side.EncodeMS, err = cpu(21, func() error { _, err := bucketmap.Encode(c); return err }); err != nil {
			return nil, err
		}
		if side.DecodeMS, err = cpu(21, func() error { _, _, err := bucketmap.DecodeRecord("/bench", data); return err }); err != nil {
			return nil, err
		}
		sum.Sides = append(sum.Sides, side)
	}
	out.Say("map propagation: level %d (%d buckets), %d nodes, layout %s", *level, m.Buckets(), *nodeCount, *layout)

	admin, err := clustertest.OpenSession(ctx, *zkConnect, "scripts/devenv --plain up")
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	p := topo.MustPaths(root, clusterNm)
	st := bucketmap.NewStore(admin, p)
	rec := topo.ClusterRecord{Version: topo.ClusterVersion, Name: clusterNm, Seed: seedHex, CreatedAt: time.Now().UTC()}
	if err := st.Create(ctx, rec, m, bucketmap.CreateOptions{}); err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := topo.DeleteRoot(cctx, admin, p); err != nil {
			out.Say("cleanup: ZooKeeper %s: %v", root, err)
		}
	}()

	sum.LoadAvg = append(sum.LoadAvg, benchkit.LoadAvg(1))
	defer func() { sum.LoadAvg = append(sum.LoadAvg, benchkit.LoadAvg(1)) }()
	t0 := time.Now()
	f, err := startFleet(ctx, p)
	if err != nil {
		return sum, err
	}
	defer f.close()
	sum.ConnectSeconds = time.Since(t0).Seconds()
	out.Say("%d watchers (routers on their own sessions, in this process, sharing %d cores with ZooKeeper) have map version 1 after %.1f s",
		len(f.ws), sum.Cores, sum.ConnectSeconds)

	// What the fleet reads when nothing changes: heartbeats and pings.
	time.Sleep(time.Second)
	idle0, idleT := f.wire(), time.Now()
	time.Sleep(3 * time.Second)
	sum.IdleBytesPerS = float64(f.wire()-idle0) / time.Since(idleT).Seconds()

	cur, zv, err := st.Load(ctx)
	if err != nil {
		return sum, err
	}
	rng := rand.New(rand.NewPCG(3, 5))
	perWatcher := map[string][]float64{}
	defer summarize(sum, perWatcher)
	moves := *changes / 2 * len(encs)
	for mvN := range moves {
		enc := encs[mvN%len(encs)]
		b := uint32(rng.IntN(cur.Buckets()))
		to := cur.Nodes()[rng.IntN(len(cur.Nodes()))].ID
		for to == cur.Owner(b) {
			to = cur.Nodes()[rng.IntN(len(cur.Nodes()))].ID
		}
		for _, kind := range []string{"moving", "flip"} {
			edit := func(m *bucketmap.Map) error {
				m.Encoding = enc
				if kind == "moving" {
					return m.SetMoving(bucketmap.Bucket{Prefix: b, Depth: m.Level}, to, fmt.Sprintf("mv-%d", mvN))
				}
				return m.Assign(bucketmap.Bucket{Prefix: b, Depth: m.Level}, to, bucketmap.AssignOptions{})
			}
			before, start := f.wire(), time.Now()
			next, nzv, _, err := st.UpdateAlso(ctx, cur, zv, edit, nil)
			if err != nil {
				return sum, fmt.Errorf("change %d: %w", len(sum.Changes)+1, err)
			}
			written := time.Now()
			got, err := f.await(ctx, next.Version)
			if err != nil {
				return sum, err
			}
			// Give the last answers (member-record writes) time to land
			// before reading the counters: they belong to this change.
			time.Sleep(100 * time.Millisecond)
			window, wire := time.Since(start), f.wire()-before
			cur, zv = next, nzv
			data, err := bucketmap.Encode(next)
			if err != nil {
				return sum, err
			}
			ch := Change{N: len(sum.Changes) + 1, Encoding: string(enc), Kind: kind, Bucket: b, MapVersion: next.Version,
				RecordBytes: len(data), WireBytes: wire, WriteMS: benchkit.MS(written.Sub(start)), WindowMS: benchkit.MS(window)}
			var lat []float64
			var last time.Time
			for _, at := range got {
				if at.After(last) {
					last = at
				}
				if at.Before(written) {
					ch.Early++ // counted as 0 ms
				}
				lat = append(lat, benchkit.MS(max(at.Sub(written), 0)))
			}
			s := benchkit.Of(lat)
			ch.AllMS, ch.P50MS, ch.AllStartMS = s.Max, s.P50, benchkit.MS(last.Sub(start))
			sum.Changes = append(sum.Changes, ch)
			out.Say("  %2d  %-5s %-6s bucket %5d  v%-3d  record %7d B  wire %9d B  write %6.1f ms  applied p50 %7.1f  all %7.1f ms (%7.1f from the write's start)",
				ch.N, ch.Encoding, ch.Kind, ch.Bucket, ch.MapVersion, ch.RecordBytes, ch.WireBytes, ch.WriteMS, ch.P50MS, ch.AllMS, ch.AllStartMS)
			perWatcher[string(enc)] = append(perWatcher[string(enc)], lat...)
		}
	}
	return sum, nil
}
