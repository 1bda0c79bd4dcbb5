// Package router answers "which db node holds this user" from the watched
// bucket map, for Go apps. The HTTP sidecar that serves it to apps in any
// language is package sidecar (cmd/router).
//
// Lookups never touch the network and never block on ZooKeeper: the router
// keeps an immutable snapshot of the map and swaps in a new one atomically,
// so a reader sees the old map or the new one, never a mix.
//
// An application opens one with Dial (its own ZooKeeper session, from a
// plain Config), New (a session the process already has), or NewFromFile /
// FromWorkerEnv (a map file, with no ZooKeeper). examples/embed is an app in
// its own module that does so.
package router

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
	"github.com/shardvisor/shardvisor/zksession"
)

// ErrNotReady means no map has been loaded yet.
var ErrNotReady = errors.New("router has no bucket map yet")

// Route is the answer for one user id.
type Route struct {
	// Bucket is the user's bucket, numbered at its depth Level: on a map
	// at one depth Level is the map's level; at mixed depths it is that
	// bucket's own (bucketmap.Bucket).
	Bucket uint32
	Level  int
	Node   bucketmap.NodeID
	DSN    string // the node's DSN, without password
	// PoolDSN is the node's application path, its pooler, when it has one
	// (bucketmap.Node.PoolDSN): applications connect there, DSN is for
	// session work.
	PoolDSN string
	// Group is the node's Patroni scope when it is a group ("" for a
	// plain server); its DSN then lists the members and reaches the
	// primary (target_session_attrs=read-write).
	Group      string
	MapVersion uint64
	State      bucketmap.BucketState // active, or moving while a move's write pause is on
	Target     bucketmap.NodeID      // moving: where the bucket is going
	DataLost   bool
	// Suspended: ZooKeeper is unreachable for now; the answer comes from
	// the last map, which is very likely still current.
	Suspended bool
	// Stale: the ZooKeeper session is lost; the answer comes from the last
	// map, which may be out of date. The caller decides whether to use it.
	Stale bool
	// Moved (stale-map protocol, RouteAt): at the map version the caller
	// used, the bucket was on MovedFrom; it is now on Node. Redo the
	// request there.
	Moved     bool
	MovedFrom bucketmap.NodeID
}

// Source says where the router's map comes from.
type Source string

const (
	SourceZooKeeper Source = "zookeeper"
	SourceFile      Source = "file"
)

// Options configure a Router.
type Options struct {
	Logger *zap.Logger
	// MemberID, when set with a ZooKeeper source, registers an ephemeral
	// member record at Paths.Router(MemberID) with the applied map version.
	MemberID   string
	MemberAddr string
	// Keep is how many recent map versions are kept for the stale-map
	// protocol (default 16); older ones are answered from the map's
	// ownership history.
	Keep int
	// TunePool adjusts each node's pool configuration (sizes, timeouts).
	TunePool func(*pgxpool.Config)
}

// snapshot is one immutable map version with everything a lookup needs.
type snapshot struct {
	m       *bucketmap.Map
	ks      *keystream.Keystream
	shift   uint
	owners  []uint16
	depth   []uint8 // per slot, nil at one depth (bucketmap.Map.SlotDepths)
	nodes   []bucketmap.Node
	flagged []bool // bucket has state beyond its owner
	cluster string
	seed    string
	raw     []byte // the map record's plain JSON
	etag    string
	// The map file document (the sidecar's GET /v1/map), made on first
	// use rather than for every map version: most routers (those in apps)
	// never serve it, and compacting a 2^16-bucket map into it costs a
	// third of applying one.
	fileOnce sync.Once
	file     []byte
	fileErr  error
	at       time.Time
}

// Router answers routing questions from the newest map it has.
type Router struct {
	opts    Options
	log     *zap.Logger
	source  Source
	zkMode  bool // source is ZooKeeper: answers carry its state
	session *zksession.Session
	paths   topo.Paths
	// ownSession: Dial opened the session, so Close closes it.
	ownSession bool

	snap    atomic.Pointer[snapshot]
	ready   chan struct{}
	readyMu sync.Once

	mu       sync.Mutex
	recent   []*snapshot // newest last
	pools    map[poolKey]*poolEntry
	watchers []func(version uint64)
	member   *topo.RouterRegistration
	started  time.Time

	cancel context.CancelFunc
	done   chan struct{}
	stats  Stats
}

// Stats are the router's counters; the sidecar exports them as metrics.
type Stats struct {
	MapUpdates  atomic.Int64
	MapRejected atomic.Int64
	LastError   atomic.Pointer[string]
}

// poolKey names a pool: a node's application path, or its direct one.
type poolKey struct {
	id     bucketmap.NodeID
	direct bool
}

type poolEntry struct {
	pool *pgxpool.Pool
	node bucketmap.Node
}

func newRouter(opts Options, src Source) *Router {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Keep <= 0 {
		opts.Keep = 16
	}
	r := &Router{opts: opts, log: opts.Logger.With(zap.String("component", "router")), source: src,
		ready: make(chan struct{}), pools: map[poolKey]*poolEntry{}, done: make(chan struct{}), started: time.Now()}
	return r
}

// New starts a router that follows the cluster's map in ZooKeeper through
// the process's session. It returns at once; Ready/WaitReady tell when the
// first map is in. The router never writes the map.
func New(s *zksession.Session, p topo.Paths, opts Options) *Router {
	r := newRouter(opts, SourceZooKeeper)
	r.session, r.paths, r.zkMode = s, p, true
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	sub := s.Subscribe()
	go func() {
		for ch := range sub.C {
			r.log.Info("zookeeper state", zap.Stringer("state", ch.To), zap.String("reason", ch.Reason))
		}
	}()
	go func() {
		defer close(r.done)
		defer sub.Close()
		r.follow(ctx)
	}()
	return r
}

// NewFromFile starts a router from a map file (the one the supervisor hands
// its workers, or a saved GET /v1/map), with no ZooKeeper at all.
//
// Under a supervisor in reload mode (SHARDVISOR_MAP_DELIVERY=reload, and
// path is SHARDVISOR_MAP_FILE) the router follows the file: it loads each
// new map the supervisor writes there and acknowledges it with
// MAPVERSION=N, so the worker never restarts for a map change.
func NewFromFile(path string, opts Options) (*Router, error) {
	f, ok := workerproto.MapFollowFromEnv()
	follow := ok && f.Reload && filepath.Clean(f.Path) == filepath.Clean(path)
	return newFromFile(path, opts, follow, f)
}

// FollowFile is NewFromFile following the file whatever the environment:
// every MapPollInterval, and on sig if not 0.
func FollowFile(path string, sig syscall.Signal, opts Options) (*Router, error) {
	return newFromFile(path, opts, true, workerproto.MapFollow{Path: path, Reload: true, Signal: sig})
}

func newFromFile(path string, opts Options, follow bool, f workerproto.MapFollow) (*Router, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	r := newRouter(opts, SourceFile)
	snap, err := snapshotFromFile(path, data)
	if err != nil {
		return nil, err
	}
	r.install(snap)
	if !follow {
		r.cancel = func() {}
		close(r.done)
		return r, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		workerproto.FollowMapFile(ctx, f, snap.m.Version, func(data []byte) (uint64, error) {
			next, err := snapshotFromFile(path, data)
			if err != nil {
				return 0, err
			}
			cur := r.snap.Load()
			switch {
			case next.m.Version == cur.m.Version:
				return cur.m.Version, nil
			case next.m.Version < cur.m.Version:
				return 0, fmt.Errorf("map file %s holds map version %d, older than the applied %d", path, next.m.Version, cur.m.Version)
			}
			r.install(next)
			return next.m.Version, nil
		}, func(err error) { r.fail("map file", err) })
	}()
	return r, nil
}

func snapshotFromFile(path string, data []byte) (*snapshot, error) {
	rec, err := bucketmap.DecodeMapFile(path, data)
	if err != nil {
		return nil, err
	}
	m, err := bucketmap.Decode(path+": map", rec.Map)
	if err != nil {
		return nil, err
	}
	seed, err := keystream.ParseSeed(rec.Seed)
	if err != nil {
		return nil, &topo.RecordError{Kind: "map file", Path: path, Err: err}
	}
	ks, err := keystream.New(seed)
	if err != nil {
		return nil, err
	}
	return newSnapshot(m, ks, rec.Cluster, rec.Seed, rec.Map), nil
}

func newSnapshot(m *bucketmap.Map, ks *keystream.Keystream, cluster, seed string, raw []byte) *snapshot {
	s := &snapshot{m: m, ks: ks, shift: uint(64 - m.Level), owners: m.OwnerIndexes(), depth: m.SlotDepths(), nodes: m.Nodes(), cluster: cluster, seed: seed, raw: raw, at: time.Now()}
	s.flagged = make([]bool, m.Slots())
	for _, b := range m.NonActive() {
		lo, hi := m.SlotsOf(b)
		for i := lo; i <= hi; i++ {
			s.flagged[i] = true
		}
	}
	s.etag = fmt.Sprintf(`"%s-v%d"`, cluster, m.Version)
	return s
}

// mapFile is the snapshot's map file document (bucketmap.EncodeMapFile).
func (s *snapshot) mapFile() ([]byte, error) {
	s.fileOnce.Do(func() { s.file, s.fileErr = bucketmap.EncodeMapFile(s.cluster, s.seed, s.raw) })
	return s.file, s.fileErr
}

// follow reads the cluster's seed once, then applies every new map version.
func (r *Router) follow(ctx context.Context) {
	var rec *topo.ClusterRecord
	for b := backoff.New(100*time.Millisecond, 5*time.Second); ; {
		var err error
		rec, err = topo.ReadCluster(ctx, r.session, r.paths)
		if err == nil {
			break
		}
		r.fail("reading the cluster record", err)
		if b.Wait(ctx) != nil {
			return
		}
	}
	seed, err := keystream.ParseSeed(rec.Seed)
	if err != nil {
		r.fail("cluster seed", err)
		return
	}
	ks, err := keystream.New(seed)
	if err != nil {
		r.fail("cluster seed", err)
		return
	}
	w := topo.WatchMap(ctx, r.session, r.paths)
	defer w.Stop()
	// A member record that could not be written (session suspended) is
	// retried here, so that a move waiting on routers is not stuck.
	retry := time.NewTicker(2 * time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-w.C:
			r.apply(ctx, n, ks, rec)
		case <-retry.C:
			if cur := r.snap.Load(); cur != nil && r.opts.MemberID != "" && r.member == nil {
				r.register(ctx, cur.m.Version)
			}
		}
	}
}

func (r *Router) fail(what string, err error) {
	msg := what + ": " + err.Error()
	r.stats.LastError.Store(&msg)
	r.log.Error(what, zap.Error(err))
}

// apply installs a map read from ZooKeeper, unless it is missing,
// malformed or older than the one in use: then the router keeps serving
// the last good map and says why.
func (r *Router) apply(ctx context.Context, n zksession.Node, ks *keystream.Keystream, rec *topo.ClusterRecord) {
	if !n.Exists {
		r.stats.MapRejected.Add(1)
		r.fail("bucket map", fmt.Errorf("no map at %s; keeping the last one", r.paths.Map()))
		return
	}
	// The map file embeds the record's plain JSON, whichever form the
	// znode holds (bucketmap.MapEncoding).
	m, js, err := bucketmap.DecodeRecord(r.paths.Map(), n.Data)
	if err != nil {
		r.stats.MapRejected.Add(1)
		r.fail("bucket map rejected; keeping the last good one", err)
		return
	}
	if cur := r.snap.Load(); cur != nil && m.Version <= cur.m.Version {
		if m.Version < cur.m.Version {
			r.stats.MapRejected.Add(1)
			r.fail("bucket map", fmt.Errorf("map version %d is older than the applied %d; ignored", m.Version, cur.m.Version))
		}
		return
	}
	r.install(newSnapshot(m, ks, rec.Name, rec.Seed, js))
	r.register(ctx, m.Version)
}

func (r *Router) install(s *snapshot) {
	r.mu.Lock()
	// Stored under the lock, so that Applied's last entry is the map in use.
	r.snap.Store(s)
	r.stats.MapUpdates.Add(1)
	r.recent = append(r.recent, s)
	if len(r.recent) > r.opts.Keep {
		r.recent = r.recent[len(r.recent)-r.opts.Keep:]
	}
	stale := r.stalePools(s.m)
	watchers := append([]func(uint64){}, r.watchers...)
	r.mu.Unlock()
	for _, p := range stale {
		p.Close()
	}
	r.readyMu.Do(func() { close(r.ready) })
	r.log.Info("bucket map applied", zap.Uint64("map_version", s.m.Version), zap.Int("level", s.m.Level), zap.Int("nodes", len(s.nodes)))
	for _, f := range watchers {
		f(s.m.Version)
	}
}

// register publishes the applied map version in the member record.
func (r *Router) register(ctx context.Context, version uint64) {
	if r.opts.MemberID == "" || r.session == nil {
		return
	}
	host, _ := os.Hostname()
	rec := topo.RouterMember{Version: topo.RouterMemberVersion, ID: r.opts.MemberID, Host: host, PID: os.Getpid(), Addr: r.opts.MemberAddr,
		MapVersion: version, StartedAt: r.started.UTC().Format(time.RFC3339), AppliedAt: time.Now().UTC().Format(time.RFC3339Nano)}
	if r.member == nil {
		reg, err := topo.RegisterRouter(ctx, r.session, r.paths, rec)
		if err != nil {
			r.fail("registering the router member record", err)
			return
		}
		r.member = reg
		return
	}
	if err := r.member.Update(ctx, rec); err != nil {
		// The new data is kept and re-sent when the session comes back.
		r.fail("updating the router member record", err)
	}
}

// OnUpdate calls f (on the router's goroutine) after each new map version is
// applied. f must not block.
func (r *Router) OnUpdate(f func(version uint64)) {
	r.mu.Lock()
	r.watchers = append(r.watchers, f)
	r.mu.Unlock()
}

// Ready reports whether a map is loaded.
func (r *Router) Ready() bool { return r.snap.Load() != nil }

// WaitReady blocks until a map is loaded or ctx ends.
func (r *Router) WaitReady(ctx context.Context) error {
	select {
	case <-r.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the first bucket map: %w", ctx.Err())
	}
}

// Source says where the map comes from.
func (r *Router) Source() Source { return r.source }

// ZKState is the ZooKeeper session state (connected for a file source).
// In ZooKeeper mode it is the session's own, read now: the copy the
// subscription kept lagged a state change by its delivery, and a route
// asked in between (right after the first map, CI) was marked stale.
func (r *Router) ZKState() zksession.State {
	if r.zkMode {
		return r.session.State()
	}
	return zksession.StateConnected
}

// Map returns the current map (nil before the first). Do not modify it.
func (r *Router) Map() *bucketmap.Map {
	if s := r.snap.Load(); s != nil {
		return s.m
	}
	return nil
}

// Keystream returns the cluster's keystream (nil before the first map),
// for an app that stores the bucket key (keystream.Key) with its rows.
func (r *Router) Keystream() *keystream.Keystream {
	if s := r.snap.Load(); s != nil {
		return s.ks
	}
	return nil
}

// Stats returns the router's counters.
func (r *Router) Stats() *Stats { return &r.stats }

// MapFile returns the current map file document and its ETag.
func (r *Router) MapFile() ([]byte, string, error) {
	s := r.snap.Load()
	if s == nil {
		return nil, "", ErrNotReady
	}
	file, err := s.mapFile()
	if err != nil {
		return nil, "", err
	}
	return file, s.etag, nil
}

// Route answers for one user id. It does not allocate, touch the network
// or wait for ZooKeeper.
func (r *Router) Route(uid string) (Route, error) {
	s := r.snap.Load()
	if s == nil {
		return Route{}, ErrNotReady
	}
	return r.route(s, uid), nil
}

// route answers from one snapshot (a batch uses one for all its ids, so
// that every answer in it has the same map version).
func (r *Router) route(s *snapshot, uid string) Route {
	b := uint32(s.ks.Prefix64(uid) >> s.shift) // level 0: a shift by 64 gives 0
	n := &s.nodes[s.owners[b]]
	rt := Route{Bucket: b, Level: s.m.Level, Node: n.ID, DSN: n.DSN, PoolDSN: n.PoolDSN, Group: n.Patroni.Scope, MapVersion: s.m.Version, State: bucketmap.BucketActive}
	if s.depth != nil { // mixed depths: the directory slot names its bucket's depth
		d := s.depth[b]
		rt.Bucket, rt.Level = b>>(uint(s.m.Level)-uint(d)), int(d)
	}
	if s.flagged[b] {
		bm := s.m.Meta(b)
		rt.State, rt.Target, rt.DataLost = bm.State, bm.Target, bm.DataLost
	}
	if r.zkMode {
		if st := r.ZKState(); st != zksession.StateConnected {
			rt.Suspended = st == zksession.StateSuspended
			rt.Stale = !rt.Suspended
		}
	}
	return rt
}

// RouteAt is Route for a caller that used map version used (the
// stale-map protocol): if the user's bucket had another owner at that
// version, the answer says Moved, and from where, so the caller can redo
// its request at the right node. used 0 means unknown (plain Route).
func (r *Router) RouteAt(uid string, used uint64) (Route, error) {
	s := r.snap.Load()
	if s == nil {
		return Route{}, ErrNotReady
	}
	rt := r.route(s, uid)
	if used == 0 || used >= rt.MapVersion {
		return rt, nil
	}
	if old, ok := r.ownerAt(s, uid, used); ok && old != rt.Node {
		rt.Moved, rt.MovedFrom = true, old
	}
	return rt, nil
}

// RouteBatch answers for many user ids from one map version, so that every
// answer has the same one, and applies the stale-map protocol (RouteAt) for
// a caller that used map version used (0: unknown). It appends the answers,
// in the order of uids, to dst (which a caller may reuse) and returns it.
func (r *Router) RouteBatch(dst []Route, uids []string, used uint64) (mapVersion uint64, routes []Route, err error) {
	s := r.snap.Load()
	if s == nil {
		return 0, dst, ErrNotReady
	}
	for _, uid := range uids {
		rt := r.route(s, uid)
		if used != 0 && used < rt.MapVersion {
			if old, ok := r.ownerAt(s, uid, used); ok && old != rt.Node {
				rt.Moved, rt.MovedFrom = true, old
			}
		}
		dst = append(dst, rt)
	}
	return s.m.Version, dst, nil
}

// AppliedMap is a map version the router applied.
type AppliedMap struct {
	Map     *bucketmap.Map // do not modify it
	Cluster string
	At      time.Time // when the router applied it
}

// Applied lists the map versions the router keeps (Options.Keep), oldest
// first; the last is the one in use. It is empty before the first map.
func (r *Router) Applied() []AppliedMap {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]AppliedMap, 0, len(r.recent))
	for _, s := range r.recent {
		out = append(out, AppliedMap{Map: s.m, Cluster: s.cluster, At: s.at})
	}
	return out
}

// ownerAt finds who owned uid's bucket at map version v: from a recent
// snapshot of exactly that version if the router saw it, else from the
// current map's ownership history (complete until GC prunes it, which
// happens only after the old owner's rows are gone).
func (r *Router) ownerAt(cur *snapshot, uid string, v uint64) (bucketmap.NodeID, bool) {
	r.mu.Lock()
	var old *snapshot
	for _, s := range r.recent {
		if s.m.Version == v {
			old = s
		}
	}
	r.mu.Unlock()
	if old != nil {
		b := uint32(old.ks.Prefix64(uid) >> old.shift)
		return old.m.Owner(b), true
	}
	b := uint32(cur.ks.Prefix64(uid) >> cur.shift)
	var best *bucketmap.Handoff
	for _, h := range cur.m.HistoryOf(b) {
		if h.UntilVersion > v && (best == nil || h.UntilVersion < best.UntilVersion) {
			h := h
			best = &h
		}
	}
	if best != nil {
		return best.Node, true
	}
	return cur.m.Owner(b), true
}

// Pool returns the connection pool of the node that holds uid, creating it
// on first use. Pools of nodes that leave the registry (or change DSN or
// password reference) are closed when the map that says so is applied.
func (r *Router) Pool(ctx context.Context, uid string) (*pgxpool.Pool, Route, error) {
	rt, err := r.Route(uid)
	if err != nil {
		return nil, rt, err
	}
	p, err := r.NodePool(ctx, rt.Node)
	return p, rt, err
}

// NodePool returns the pool of one node's application path: its pooler
// when the registry names one (bucketmap.Node.PoolDSN), else its DSN,
// sized for a prefork worker (dbnode.AppPoolConfig: 2 connections, idle
// ones closed after a minute; TunePool changes that).
func (r *Router) NodePool(ctx context.Context, id bucketmap.NodeID) (*pgxpool.Pool, error) {
	return r.nodePool(ctx, poolKey{id: id})
}

// DirectPool returns a pool on the node's direct path (its DSN), past its
// pooler: the escape hatch for work that needs a session of its own, which
// a pooler in transaction mode does not keep from one transaction to the
// next: SET without LOCAL, session advisory locks, LISTEN, WITH HOLD
// cursors, temporary tables (docs/data-contract.md). It counts against
// the node's max_connections directly: keep its use rare and short. On a
// node without a pooler it is a pool of its own on the same DSN.
func (r *Router) DirectPool(ctx context.Context, id bucketmap.NodeID) (*pgxpool.Pool, error) {
	return r.nodePool(ctx, poolKey{id: id, direct: true})
}

func (r *Router) nodePool(ctx context.Context, k poolKey) (*pgxpool.Pool, error) {
	m := r.Map()
	if m == nil {
		return nil, ErrNotReady
	}
	node, ok := m.Node(k.id)
	if !ok {
		return nil, fmt.Errorf("db node %s is not in the registry", k.id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.pools[k]; ok && sameWay(e.node, node) {
		return e.pool, nil
	}
	configFor := dbnode.AppPoolConfig
	if k.direct {
		configFor = dbnode.SessionPoolConfig
	}
	cfg, err := configFor(node)
	if err != nil {
		return nil, err
	}
	if r.opts.TunePool != nil {
		r.opts.TunePool(cfg)
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("db node %s: %w", k.id, err)
	}
	if old, ok := r.pools[k]; ok {
		go old.pool.Close()
	}
	r.pools[k] = &poolEntry{pool: p, node: node}
	return p, nil
}

// sameWay reports whether a pool made for node a still reaches node b.
func sameWay(a, b bucketmap.Node) bool {
	return a.DSN == b.DSN && a.PoolDSN == b.PoolDSN && a.Password == b.Password
}

// stalePools removes (and returns, to close) the pools whose node left the
// registry or changed how it is reached. Caller holds r.mu.
func (r *Router) stalePools(m *bucketmap.Map) []*pgxpool.Pool {
	var out []*pgxpool.Pool
	for k, e := range r.pools {
		n, ok := m.Node(k.id)
		if !ok || n.State == bucketmap.NodeRemoved || !sameWay(n, e.node) {
			out = append(out, e.pool)
			delete(r.pools, k)
		}
	}
	return out
}

// Close stops following the map, removes the member record and closes the
// pools, and the session if Dial opened it.
func (r *Router) Close() {
	r.cancel()
	<-r.done
	if r.member != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = r.member.Remove(ctx)
		cancel()
	}
	r.mu.Lock()
	for id, e := range r.pools {
		e.pool.Close()
		delete(r.pools, id)
	}
	r.mu.Unlock()
	if r.ownSession {
		r.session.Close()
	}
}
