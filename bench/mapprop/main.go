// Command mapprop-bench measures map propagation (fleet benchmark, "Map
// propagation"): how many bytes ZooKeeper sends a fleet of watchers for
// one change of a level-16 bucket map, and how long until every watcher
// has applied it, with the map record stored plain (the baseline) and
// gzip-compressed (bucketmap.MapGzip), side by side in one run. Run it with
// bench/mapprop/run.
//
// Against the local ZooKeeper ensemble of scripts/devenv:
//
//  1. a throwaway cluster under /shardvisor-bench/mapprop-<time>: a map
//     of 2^LEVEL buckets over NODES db nodes (layout: see --layout);
//  2. WATCHERS routers (router.New, the library the sidecar and apps
//     use), each on its own ZooKeeper session, as a fleet of processes
//     would be, so that the servers send one copy of every change per
//     watcher; each registers a member record (--members), as sidecars
//     do. They all live in this process, which shares the machine's
//     cores with the three ZooKeeper servers: every decode of every
//     watcher queues for the same CPUs, which a real fleet (one watcher
//     per host) does not;
//  3. CHANGES map changes per encoding, each one compare-and-swap write
//     of one bucket as a move makes them: the bucket goes "moving", then
//     flips to its new owner. Moves alternate between the encodings
//     (plain move, gzip move, plain move, ...), so both see the same
//     ZooKeeper, the same heap and the same map size;
//  4. per change: the bytes every watcher's connection read from
//     ZooKeeper between the write and the moment the last watcher applied
//     it (counted on the wire by wrapping each session's connection,
//     zksession.Config.Dial: it is what the servers really send, the
//     watch notification, the getData answer with the record, the
//     answers to the member-record writes and the session's own
//     heartbeats included), and for each watcher the time from the write's
//     return to its router's OnUpdate (the map decoded, checked and
//     installed).
//
// It prints a table per change, the distributions, the decode and encode
// CPU of one record in each form, and each figure against its baseline.
// The cluster is deleted at the end.
package main

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

var (
	level     = flag.Int("level", 16, "map level: 2^level buckets")
	nodeCount = flag.Int("nodes", 100, "db nodes in the map")
	watchers  = flag.Int("watchers", 100, "routers following the map, each on its own ZooKeeper session")
	changes   = flag.Int("changes", 20, "map changes per encoding (rounded up to even: a move is two changes)")
	layout    = flag.String("layout", "grown", "how the buckets are spread: grown (a cluster grown from 10 nodes one join at a time by the planner), fresh (shardctl init's contiguous runs) or shuffled (every bucket's owner at random: the worst case for compression)")
	encodings = flag.String("encodings", "plain,gzip", "encodings to compare, the first being the baseline")
	members   = flag.Bool("members", true, "watchers register router member records and update them on every change, as sidecars do")
	timeout   = flag.Duration("timeout", 30*time.Second, "how long to wait for every watcher to apply one change")
	zkConnect = flag.String("zk", cliutil.LocalZK, "ZooKeeper connect string")
	jsonOut   = flag.Bool("json", false, "print the summary as JSON on stdout (the report goes to stderr)")
	noLock    = flag.Bool("no-lock", false, "do not take the test environment's shared lock")
	cpuProf   = flag.String("cpuprofile", "", "write a CPU profile of the changes (watchers and writer) to `file`")
	devenvDir = flag.String("devenv-dir", benchkit.EnvOr("SHARDVISOR_DEVENV_DIR", benchkit.DefaultDevenvDir), "scripts/devenv state directory (its lock)")
)

const (
	clusterNm = "mapprop"
	seedHex   = "6d61702d70726f7061676174696f6e2d62656e6368" // "map-propagation-bench"
	target    = 1000.0                                       // ms: every watcher applies a change within 1 s, p99
)

// printer prints the report: on stdout, or stderr with --json.
var printer = &benchkit.Printer{W: os.Stdout}

func say(format string, args ...any) { printer.Say(format, args...) }

func main() {
	flag.Parse()
	if *jsonOut {
		printer.W = os.Stderr
	}
	if *level < 1 || *level > bucketmap.MaxLevel || *nodeCount < 2 || *watchers < 1 || *changes < 1 {
		fmt.Fprintf(os.Stderr, "mapprop-bench: --level 1..%d, --nodes >= 2, --watchers and --changes >= 1\n", bucketmap.MaxLevel)
		os.Exit(2)
	}
	*changes += *changes % 2
	var encs []bucketmap.MapEncoding
	for _, s := range strings.Split(*encodings, ",") {
		e, err := bucketmap.ParseMapEncoding(strings.TrimSpace(s))
		if err != nil {
			fmt.Fprintln(os.Stderr, "mapprop-bench: --encodings:", err)
			os.Exit(2)
		}
		encs = append(encs, e)
	}
	ctx, stop := benchkit.Context()
	defer stop()
	sum, err := run(ctx, encs)
	benchkit.Finish("mapprop-bench", sum, err, func(s *Summary, e string) { s.Error = e }, report, *jsonOut)
}

// ---------------------------------------------------------------- figures

// Stat is a distribution's nearest-rank percentiles.
type Stat = benchkit.Stat

func stat(xs []float64) Stat { return benchkit.Of(xs) }

// Change is one map change.
type Change struct {
	N           int     `json:"n"`
	Encoding    string  `json:"encoding"`
	Kind        string  `json:"kind"` // moving or flip
	Bucket      uint32  `json:"bucket"`
	MapVersion  uint64  `json:"map_version"`
	RecordBytes int     `json:"record_bytes"` // the znode's data
	WireBytes   int64   `json:"wire_bytes"`   // read by all watchers' connections
	WriteMS     float64 `json:"write_ms"`     // the compare-and-swap, encoding included
	AllMS       float64 `json:"all_applied_ms"`
	AllStartMS  float64 `json:"all_applied_from_write_start_ms"`
	P50MS       float64 `json:"watcher_p50_ms"`
	Early       int     `json:"applied_before_write_returned"`
	WindowMS    float64 `json:"window_ms"`
}

// Side is one encoding's figures.
type Side struct {
	Encoding     string  `json:"encoding"`
	RecordBytes  int     `json:"record_bytes"`
	PlainBytes   int     `json:"plain_json_bytes"`
	EncodeMS     float64 `json:"encode_ms"`        // Encode of the map, one writer
	DecodeMS     float64 `json:"decode_ms"`        // DecodeRecord, one watcher, one goroutine
	BytesPerChg  float64 `json:"bytes_per_change"` // median over changes
	PerWatcher   float64 `json:"bytes_per_watcher_per_change"`
	WatcherMS    Stat    `json:"watcher_apply_ms"` // every watcher of every change
	AllAppliedMS Stat    `json:"all_applied_ms"`   // per change: until the last watcher
	FromStartMS  Stat    `json:"all_applied_from_write_start_ms"`
	WriteMS      Stat    `json:"write_ms"`
	Early        int     `json:"applied_before_write_returned"`
	TargetMet    bool    `json:"target_met"`
	TargetMetAll bool    `json:"target_met_from_write_start"`
}

// Summary is everything the run found.
type Summary struct {
	Cores          int      `json:"cores"`
	Level          int      `json:"level"`
	Buckets        int      `json:"buckets"`
	Nodes          int      `json:"nodes"`
	Layout         string   `json:"layout"`
	Watchers       int      `json:"watchers"`
	Members        bool     `json:"members"`
	ChangesPerEnc  int      `json:"changes_per_encoding"`
	ZKRoot         string   `json:"zk_root"`
	IdleBytesPerS  float64  `json:"idle_wire_bytes_per_s"`
	ConnectSeconds float64  `json:"connect_seconds"`
	LoadAvg        []string `json:"load_average_start_end"`
	LockSeconds    float64  `json:"lock_wait_seconds"`
	Sides          []*Side  `json:"encodings"`
	Changes        []Change `json:"changes"`
	Error          string   `json:"error,omitempty"`
}

// ---------------------------------------------------------------- the map

func dbNode(i int) bucketmap.Node {
	id := fmt.Sprintf("db%03d", i+1)
	return bucketmap.Node{ID: bucketmap.NodeID(id), DSN: "postgres://app@" + id + ".db.internal:5432/app?sslmode=verify-full",
		Password: "file:/etc/shardvisor/" + id + ".pw", Weight: 1, State: bucketmap.NodeActive}
}

// buildMap makes the level-LEVEL map over NODES nodes in the chosen
// layout, at version 1 with no history.
func buildMap(now time.Time) (*bucketmap.Map, error) {
	var nodes []bucketmap.Node
	for i := range *nodeCount {
		nodes = append(nodes, dbNode(i))
	}
	switch *layout {
	case "fresh":
		return bucketmap.New(*level, nodes, now)
	case "grown":
		// Ten nodes, then one join at a time, each rebalanced by the
		// planner as the rebalancer would; history pruned as GC would.
		start := min(10, len(nodes))
		m, err := bucketmap.New(*level, nodes[:start], now)
		if err != nil {
			return nil, err
		}
		for _, n := range nodes[start:] {
			m.Version++
			if err := m.AddNode(n); err != nil {
				return nil, err
			}
			p, err := bucketmap.PlanFor(m, bucketmap.Policy{})
			if err != nil {
				return nil, err
			}
			if err := m.Apply(p); err != nil {
				return nil, err
			}
			m.PruneHistory(func(bucketmap.Handoff) bool { return true })
		}
		m.Version = 1
		return m, m.Validate()
	case "shuffled":
		m, err := bucketmap.New(*level, nodes, now)
		if err != nil {
			return nil, err
		}
		// The same counts per node, owners in random order: through the
		// record, the only way to set every owner at once.
		data, err := bucketmap.Encode(m)
		if err != nil {
			return nil, err
		}
		rec, err := bucketmap.DecodeMapRecord("", data)
		if err != nil {
			return nil, err
		}
		raw, err := base64.StdEncoding.DecodeString(rec.Owners)
		if err != nil {
			return nil, err
		}
		own := make([]uint16, len(raw)/2)
		for i := range own {
			own[i] = binary.BigEndian.Uint16(raw[2*i:])
		}
		rng := rand.New(rand.NewPCG(7, 11))
		rng.Shuffle(len(own), func(i, j int) { own[i], own[j] = own[j], own[i] })
		for i, o := range own {
			binary.BigEndian.PutUint16(raw[2*i:], o)
		}
		rec.Owners = base64.StdEncoding.EncodeToString(raw)
		js, err := json.Marshal(rec)
		if err != nil {
			return nil, err
		}
		return bucketmap.Decode("", js)
	}
	return nil, fmt.Errorf("--layout %q: want grown, fresh or shuffled", *layout)
}

// cpu times f, the median of n runs, in ms.
func cpu(n int, f func() error) (float64, error) {
	var xs []float64
	for range n {
		t := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		xs = append(xs, float64(time.Since(t).Microseconds())/1000)
	}
	return stat(xs).P50, nil
}

// ---------------------------------------------------------------- watchers

// countingConn counts the bytes the server sends on one connection.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

type applied struct {
	w  int
	v  uint64
	at time.Time
}

type watcher struct {
	sess *zksession.Session
	r    *router.Router
	read atomic.Int64
}

type fleet struct {
	ws  []*watcher
	evs chan applied
}

func (f *fleet) wire() int64 {
	var n int64
	for _, w := range f.ws {
		n += w.read.Load()
	}
	return n
}

// start opens the sessions and the routers and waits until every router
// has the map.
func startFleet(ctx context.Context, p topo.Paths) (*fleet, error) {
	f := &fleet{evs: make(chan applied, 4**watchers)}
	for range *watchers {
		w := &watcher{}
		s, err := zksession.Open(zksession.Config{Connect: *zkConnect, Dial: func(network, addr string, timeout time.Duration) (net.Conn, error) {
			c, err := net.DialTimeout(network, addr, timeout)
			if err != nil {
				return nil, err
			}
			return countingConn{c, &w.read}, nil
		}})
		if err != nil {
			f.close()
			return nil, err
		}
		w.sess = s
		f.ws = append(f.ws, w)
	}
	for _, w := range f.ws {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := w.sess.WaitConnected(wctx)
		cancel()
		if err != nil {
			f.close()
			return nil, fmt.Errorf("watcher session: %w", err)
		}
	}
	for i, w := range f.ws {
		opt := router.Options{Keep: 2} // 16 snapshots of a 2^16 map times 100 routers would be ~600 MB
		if *members {
			opt.MemberID = fmt.Sprintf("w%03d", i)
		}
		w.r = router.New(w.sess, p, opt)
		w.r.OnUpdate(func(v uint64) { f.evs <- applied{w: i, v: v, at: time.Now()} })
	}
	for _, w := range f.ws {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := w.r.WaitReady(wctx)
		cancel()
		if err != nil {
			f.close()
			return nil, fmt.Errorf("watcher router: %w", err)
		}
	}
	return f, nil
}

func (f *fleet) close() {
	var wg sync.WaitGroup
	for _, w := range f.ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w.r != nil {
				w.r.Close()
			}
			w.sess.Close()
		}()
	}
	wg.Wait()
}

// await collects every watcher's OnUpdate for version v.
func (f *fleet) await(ctx context.Context, v uint64) (map[int]time.Time, error) {
	got := map[int]time.Time{}
	t := time.NewTimer(*timeout)
	defer t.Stop()
	for len(got) < len(f.ws) {
		select {
		case ev := <-f.evs:
			if ev.v == v {
				got[ev.w] = ev.at
			}
		case <-t.C:
			return got, fmt.Errorf("after %s only %d of %d watchers applied map version %d", *timeout, len(got), len(f.ws), v)
		case <-ctx.Done():
			return got, ctx.Err()
		}
	}
	return got, nil
}

// ---------------------------------------------------------------- run

func run(ctx context.Context, encs []bucketmap.MapEncoding) (*Summary, error) {
	root := fmt.Sprintf("/shardvisor-bench/mapprop-%d", time.Now().Unix())
	sum := &Summary{Cores: runtime.NumCPU(), Level: *level, Buckets: 1 << *level, Nodes: *nodeCount, Layout: *layout,
		Watchers: *watchers, Members: *members, ChangesPerEnc: *changes, ZKRoot: root}
	if !*noLock {
		os.Setenv("SHARDVISOR_DEVENV_DIR", *devenvDir)
		t := time.Now()
		release, err := testenv.Share()
		sum.LockSeconds = time.Since(t).Seconds()
		if sum.LockSeconds > 1 {
			say("waited %.0f s for the test environment's shared lock (a disruptive test held it)", sum.LockSeconds)
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
		side := &Side{Encoding: string(e)}
		c := m.Clone()
		c.Encoding = e
		data, err := bucketmap.Encode(c)
		if err != nil {
			return nil, err
		}
		js, _ := bucketmap.EncodeJSON(c)
		side.RecordBytes, side.PlainBytes = len(data), len(js)
		if side.EncodeMS, err = cpu(21, func() error { _, err := bucketmap.Encode(c); return err }); err != nil {
			return nil, err
		}
		if side.DecodeMS, err = cpu(21, func() error { _, _, err := bucketmap.DecodeRecord("/bench", data); return err }); err != nil {
			return nil, err
		}
		sum.Sides = append(sum.Sides, side)
	}
	say("map propagation: level %d (%d buckets), %d nodes, layout %s; record %s", *level, m.Buckets(), *nodeCount, *layout, sizes(sum.Sides))

	admin, err := clustertest.OpenSession(ctx, *zkConnect, "scripts/devenv up")
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
			say("cleanup: ZooKeeper %s: %v", root, err)
		}
	}()

	sum.LoadAvg = append(sum.LoadAvg, loadAvg())
	defer func() { sum.LoadAvg = append(sum.LoadAvg, loadAvg()) }()
	t0 := time.Now()
	f, err := startFleet(ctx, p)
	if err != nil {
		return sum, err
	}
	defer f.close()
	sum.ConnectSeconds = time.Since(t0).Seconds()
	say("%d watchers (routers on their own sessions, in this process, sharing %d cores with ZooKeeper) have map version 1 after %.1f s",
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
	if *cpuProf != "" {
		pf, err := os.Create(*cpuProf)
		if err != nil {
			return sum, err
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			return sum, err
		}
		defer func() { pprof.StopCPUProfile(); pf.Close() }()
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
		moveID := fmt.Sprintf("mv-%d", mvN)
		for _, kind := range []string{"moving", "flip"} {
			edit := func(m *bucketmap.Map) error {
				m.Encoding = enc
				if kind == "moving" {
					return m.SetMoving(bucketmap.Bucket{Prefix: b, Depth: m.Level}, to, moveID)
				}
				return m.Assign(bucketmap.Bucket{Prefix: b, Depth: m.Level}, to, bucketmap.AssignOptions{})
			}
			before := f.wire()
			start := time.Now()
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
			window := time.Since(start)
			wire := f.wire() - before
			cur, zv = next, nzv
			data, err := bucketmap.Encode(next)
			if err != nil {
				return sum, err
			}
			ch := Change{N: len(sum.Changes) + 1, Encoding: string(enc), Kind: kind, Bucket: b, MapVersion: next.Version,
				RecordBytes: len(data), WireBytes: wire, WriteMS: ms(written.Sub(start)), WindowMS: ms(window)}
			var lat []float64
			var last time.Time
			for _, at := range got {
				if at.After(last) {
					last = at
				}
				d := at.Sub(written)
				if d < 0 {
					ch.Early++
					d = 0
				}
				lat = append(lat, ms(d))
			}
			s := stat(lat)
			ch.AllMS, ch.P50MS, ch.AllStartMS = s.Max, s.P50, ms(last.Sub(start))
			sum.Changes = append(sum.Changes, ch)
			say("  %2d  %-5s %-6s bucket %5d  v%-3d  record %7d B  wire %9d B  write %6.1f ms  applied p50 %7.1f  all %7.1f ms (%7.1f from the write's start)",
				ch.N, ch.Encoding, ch.Kind, ch.Bucket, ch.MapVersion, ch.RecordBytes, ch.WireBytes, ch.WriteMS, ch.P50MS, ch.AllMS, ch.AllStartMS)
			perWatcher[string(enc)] = append(perWatcher[string(enc)], lat...)
		}
	}
	return sum, nil
}

// loadAvg is the machine's 1-minute load average: other work on the
// shared cores shows in every figure.
func loadAvg() string { return benchkit.LoadAvg(1) }

// summarize fills each encoding's figures from the changes done so far
// (all of them, or those before an error).
func summarize(sum *Summary, perWatcher map[string][]float64) {
	for _, side := range sum.Sides {
		var bytes, all, fromStart, write []float64
		for _, c := range sum.Changes {
			if c.Encoding != side.Encoding {
				continue
			}
			bytes = append(bytes, float64(c.WireBytes))
			all = append(all, c.AllMS)
			fromStart = append(fromStart, c.AllStartMS)
			write = append(write, c.WriteMS)
			side.Early += c.Early
		}
		side.BytesPerChg = stat(bytes).P50
		side.PerWatcher = side.BytesPerChg / float64(*watchers)
		side.AllAppliedMS, side.FromStartMS, side.WriteMS = stat(all), stat(fromStart), stat(write)
		side.WatcherMS = stat(perWatcher[side.Encoding])
		side.TargetMet = side.AllAppliedMS.N > 0 && side.AllAppliedMS.P99 <= target
		side.TargetMetAll = side.FromStartMS.N > 0 && side.FromStartMS.P99 <= target
	}
}

func ms(d time.Duration) float64 { return benchkit.MS(d) }

func sizes(sides []*Side) string {
	var parts []string
	for _, s := range sides {
		parts = append(parts, fmt.Sprintf("%s %d B", s.Encoding, s.RecordBytes))
	}
	return strings.Join(parts, ", ")
}

// ---------------------------------------------------------------- report

func report(s *Summary) {
	msStat := Stat.MS
	say("")
	say("map propagation benchmark: level %d (%d buckets), %d nodes (layout %s), %d watchers on their own sessions in one process (member records: %v), %d changes per encoding (moves alternating between encodings), %d cores",
		s.Level, s.Buckets, s.Nodes, s.Layout, s.Watchers, s.Members, s.ChangesPerEnc, s.Cores)
	say("  load average (1 min) at the start and the end of the changes: %s", strings.Join(s.LoadAvg, ", "))
	say("  idle: the fleet reads %.0f B/s from ZooKeeper when nothing changes (heartbeats, pings); included below", s.IdleBytesPerS)
	for _, side := range s.Sides {
		verdict := func(met bool) string {
			if met {
				return "met"
			}
			return "NOT MET"
		}
		say("  %s: record %d B (plain JSON %d B); one encode %.2f ms, one decode %.2f ms (one goroutine, before the watchers start)",
			side.Encoding, side.RecordBytes, side.PlainBytes, side.EncodeMS, side.DecodeMS)
		say("      ZooKeeper bytes read per change, all watchers (wire, median): %.0f B (%.0f B per watcher)", side.BytesPerChg, side.PerWatcher)
		say("      every watcher applied, per change, from the write's return: %s   target p99 <= %.0f ms: %s", msStat(side.AllAppliedMS), target, verdict(side.TargetMet))
		say("                              the same from the write's start: %s   target p99 <= %.0f ms: %s", msStat(side.FromStartMS), target, verdict(side.TargetMetAll))
		say("      each watcher's apply, from the write's return:               %s", msStat(side.WatcherMS))
		say("      the write (CAS, encode included):                            %s", msStat(side.WriteMS))
		if side.Early > 0 {
			say("      (%d applies came before the write returned; counted as 0 ms)", side.Early)
		}
	}
	if len(s.Sides) >= 2 {
		base := s.Sides[0]
		for _, side := range s.Sides[1:] {
			say("  %s against %s (baseline), same run:", side.Encoding, base.Encoding)
			say("    bytes per change: %.0f (baseline %.0f, ratio %.3f×)", side.BytesPerChg, base.BytesPerChg, ratio(side.BytesPerChg, base.BytesPerChg))
			say("    every watcher applied, p99: %.1f ms (baseline %.1f ms, ratio %.3f×)", side.AllAppliedMS.P99, base.AllAppliedMS.P99, ratio(side.AllAppliedMS.P99, base.AllAppliedMS.P99))
			say("    every watcher applied, p50: %.1f ms (baseline %.1f ms, ratio %.3f×)", side.AllAppliedMS.P50, base.AllAppliedMS.P50, ratio(side.AllAppliedMS.P50, base.AllAppliedMS.P50))
			say("    each watcher's apply, p50: %.1f ms (baseline %.1f ms, ratio %.3f×)", side.WatcherMS.P50, base.WatcherMS.P50, ratio(side.WatcherMS.P50, base.WatcherMS.P50))
			say("    decode CPU per watcher: %.2f ms (baseline %.2f ms, ratio %.3f×)", side.DecodeMS, base.DecodeMS, ratio(side.DecodeMS, base.DecodeMS))
			say("    encode CPU per write: %.2f ms (baseline %.2f ms, ratio %.3f×)", side.EncodeMS, base.EncodeMS, ratio(side.EncodeMS, base.EncodeMS))
		}
	}
	if s.Error != "" {
		say("  ERROR: %s", s.Error)
	}
}

func ratio(x, base float64) float64 { return benchkit.Ratio(x, base) }
