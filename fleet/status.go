package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// The fleet status: every member (routers and supervisors), the pools and
// the moves, as a router last read them from ZooKeeper. Operators watch
// it during a rebalance, so page views must not turn into ZooKeeper load:
// the records are read at most once per DefaultTTL (and once more when the
// router applies a new map), by one refresh at a time that every
// concurrent viewer shares, and the last good read is served, with its
// age, when ZooKeeper cannot be read.

const (
	// fleetReadTimeout bounds one refresh (all its reads).
	fleetReadTimeout = 5 * time.Second
	// fleetRecentMoves is how many finished moves the view lists.
	fleetRecentMoves = 20
)

// DefaultTTL is how old a fleet snapshot may be before a view reads
// ZooKeeper again; a failed read is not retried sooner either.
const DefaultTTL = time.Second

// View is the fleet as the router's GET /v1/fleet and status page show
// it. Versions "behind" are counted against the router's current map.
type View struct {
	// Available is false when there is no view to show; Reason says why
	// (a router from a map file has no ZooKeeper; or nothing could be
	// read yet).
	Available bool      `json:"available"`
	Reason    string    `json:"reason,omitempty"`
	Cluster   string    `json:"cluster,omitempty"`
	Now       time.Time `json:"now"` // this router's clock, for the ages below
	Router    Self      `json:"router"`
	// TakenAt is when the records were read; AgeSeconds is Now-TakenAt.
	TakenAt    time.Time `json:"taken_at,omitzero"`
	AgeSeconds float64   `json:"age_seconds"`
	// Stale: this is not a fresh read (this router's ZooKeeper session is
	// not connected, or the last read failed: RefreshError).
	Stale        bool     `json:"stale"`
	RefreshError string   `json:"refresh_error,omitempty"`
	Stragglers   int      `json:"stragglers"` // members behind this router's map
	Members      []Member `json:"members"`
	Pools        []Pool   `json:"pools"`
	Moves        Moves    `json:"moves"`
	Schema       Schema   `json:"schema"`
	// Backups is the backup watcher's last check of every node's backups
	// (topo.BackupStatus); nil when none was written (no watcher runs).
	Backups *topo.BackupStatus `json:"backups"`
}

// Schema is the schema history as recorded (topo.SchemaChange): how many
// changes are in each state, the newest ones, every change not applied
// on every node with the nodes it misses, and the last drift check.
type Schema struct {
	Changes int `json:"changes"`
	// ByState counts the changes by their recorded state (applied,
	// partial, failed, pending).
	ByState    map[string]int    `json:"by_state"`
	Recent     []SchemaChange    `json:"recent"`
	NotApplied []SchemaChange    `json:"not_applied"`
	Drift      *topo.SchemaDrift `json:"drift"`
	Error      string            `json:"error,omitempty"`
}

// SchemaChange is one change on the status page.
type SchemaChange struct {
	Seq       int       `json:"seq"`
	ID        string    `json:"id"`
	State     string    `json:"state"`
	Source    string    `json:"source"`
	By        string    `json:"by"`
	CreatedAt time.Time `json:"created_at"`
	Applied   []string  `json:"applied"`
	// Missing names each node the change reached without applying it,
	// with what happened there.
	Missing map[string]string `json:"missing"`
}

// schemaRecent is how many changes the view lists.
const schemaRecent = 10

// Self is the router the view is seen from.
type Self struct {
	ID         string `json:"id,omitempty"` // its member id, when it registers one
	Source     string `json:"source"`       // router.Source
	ZKState    string `json:"zk_state"`
	MapVersion uint64 `json:"map_version"`
	// MapUpdatedAt is when its map version was written, AppliedAt when
	// this router applied it.
	MapUpdatedAt time.Time `json:"map_updated_at,omitzero"`
	AppliedAt    time.Time `json:"applied_at,omitzero"`
	// SchemaNodes are its map's nodes not marked down or removed: the nodes every
	// schema change must reach (nil: the recorded states are shown).
	SchemaNodes []string `json:"-"`
}

// Member is one router or supervisor, from its ephemeral record.
type Member struct {
	Kind string `json:"kind"`           // router or supervisor
	Pool string `json:"pool,omitempty"` // supervisors
	Name string `json:"name"`
	Path string `json:"path"`
	Self bool   `json:"self,omitempty"` // this router's own record
	// Error: the record did not decode; the mover counts such a member
	// as behind, and so does this view.
	Error      string `json:"error,omitempty"`
	Host       string `json:"host,omitempty"`
	PID        int    `json:"pid,omitempty"`
	Addr       string `json:"addr,omitempty"`  // routers
	State      string `json:"state,omitempty"` // supervisors: starting, serving, degraded, lost, stopping
	MapVersion uint64 `json:"map_version"`
	// Behind is how many map versions the member is below this router's
	// map; Straggler says it is (or its record is unreadable).
	// BehindSince is when the first map above the member's was written
	// (BehindAtLeast: or earlier; the router no longer knows that map).
	Behind        uint64    `json:"behind"`
	Straggler     bool      `json:"straggler"`
	BehindSince   time.Time `json:"behind_since,omitzero"`
	BehindAtLeast bool      `json:"behind_at_least,omitempty"`
	// ZK is the ZooKeeper session state as the member last reported it;
	// FailStatic its last whole-ensemble outage (supervisors).
	ZK         string      `json:"zk,omitempty"`
	FailStatic *FailStatic `json:"fail_static,omitempty"`
	Supervisor *Supervisor `json:"supervisor,omitempty"`
	StartedAt  time.Time   `json:"started_at,omitzero"`
	// UpdatedAt is when the member last wrote its record (a router: when
	// it applied its map version).
	UpdatedAt time.Time `json:"updated_at,omitzero"`

	workerMaps []uint64 // map versions of the ready workers (0: unknown)
}

// Supervisor is what a supervisor's record says about its workers.
type Supervisor struct {
	Generation    int64  `json:"generation"`
	ConfigVersion int64  `json:"config_version"`
	MapDelivery   string `json:"map_delivery,omitempty"` // swap or reload
	Accepting     bool   `json:"accepting"`
	ReadyWorkers  int    `json:"ready_workers"`
	TargetWorkers int    `json:"target_workers"`
	Workers       int    `json:"workers"` // all, starting and stopping too
	// WorkersBehind counts the ready workers that report a map version
	// below this router's (reload mode reports one per worker).
	WorkersBehind int    `json:"workers_behind"`
	LastError     string `json:"last_error,omitempty"`
}

// FailStatic is a member's last whole-ensemble outage, which it
// served through with its last map.
type FailStatic struct {
	Since   time.Time `json:"since"`
	Until   time.Time `json:"until,omitzero"`
	Ongoing bool      `json:"ongoing"` // no end reported yet
	Peers   int       `json:"peers"`
}

// Pool is one supervisor pool.
type Pool struct {
	Name string `json:"name"`
	// ConfigVersion is the stored config's version (nil: no config);
	// ConfigError says it does not decode or validate; MapDelivery is its
	// map delivery mode. Nothing else of the config is shown (its env
	// may hold secrets).
	ConfigVersion *int32 `json:"config_version"`
	ConfigError   string `json:"config_error,omitempty"`
	MapDelivery   string `json:"map_delivery,omitempty"`
	// LastSwap is the pool's status record (nil: none published yet);
	// StatusError says it could not be decoded.
	LastSwap    *Swap  `json:"last_swap"`
	StatusError string `json:"status_error,omitempty"`
	Supervisors int    `json:"supervisors"`
	Stragglers  int    `json:"stragglers"`
}

// Swap is a pool's last swap result.
type Swap struct {
	Result        string    `json:"result"`
	Member        string    `json:"member"`
	Generation    int64     `json:"generation"`
	ConfigVersion int64     `json:"config_version"`
	MapVersion    uint64    `json:"map_version"`
	SwapSeconds   float64   `json:"swap_seconds,omitempty"`
	Error         string    `json:"error,omitempty"`
	At            time.Time `json:"at"`
}

// Moves are the moves in flight (not done or aborted; failed ones
// stay here, as for GC) and the most recent finished ones.
type Moves struct {
	InFlight []Move `json:"in_flight"`
	Recent   []Move `json:"recent"` // newest first, at most 20
	Finished int    `json:"finished"`
}

// Move is one move record.
type Move struct {
	ID     string `json:"id"`
	Error  string `json:"error,omitempty"` // the move's error, or why its record is unreadable
	Bucket uint32 `json:"bucket"`
	Level  int    `json:"level"`
	Source string `json:"source"`
	Target string `json:"target"`
	State  string `json:"state"` // "" when the record is unreadable
	NoCopy bool   `json:"no_copy,omitempty"`
	// StateSince is when the current state began.
	StateSince   time.Time   `json:"state_since,omitzero"`
	CreatedAt    time.Time   `json:"created_at,omitzero"`
	UpdatedAt    time.Time   `json:"updated_at,omitzero"`
	RowsCopied   int64       `json:"rows_copied"`
	PauseMS      float64     `json:"pause_ms"`
	MemberWaitMS float64     `json:"member_wait_ms"`
	Stragglers   []Straggler `json:"stragglers"`
	Verify       string      `json:"verify,omitempty"` // ok, mismatch, inconclusive
	// RollbackOf: this move rolls that one back. Reverse is the move's
	// way back (nil: none).
	RollbackOf string       `json:"rollback_of,omitempty"`
	Reverse    *MoveReverse `json:"reverse,omitempty"`
}

// MoveReverse is where a move's reverse stream stands.
type MoveReverse struct {
	// State: pending (not started yet), lost (Lost says why), ended (the
	// move completed or rolled back); for a stream started, as the
	// watcher's latest probe of the servers says (topo.ReverseState):
	// running, disabled, lost or unknown (Reason says why), or, without
	// a probe of the last ReverseProbeStale, "started" (the record's word
	// alone: the mover enabled it once).
	State string `json:"state"`
	Lost  string `json:"lost,omitempty"`
	// Reason, LagBytes and ProbedAt are the latest probe's.
	Reason   string    `json:"reason,omitempty"`
	LagBytes *int64    `json:"lag_bytes,omitempty"`
	ProbedAt time.Time `json:"probed_at,omitzero"`
	// WindowUntil is when the rollback window ends (reversible moves).
	WindowUntil    time.Time `json:"window_until,omitzero"`
	Rollback       string    `json:"rollback,omitempty"` // the latest rollback move
	RollbackWanted string    `json:"rollback_wanted,omitempty"`
}

// Straggler is a member a move went on without (its record's path).
type Straggler struct {
	Member     string `json:"member"`
	MapVersion uint64 `json:"map_version"`
	Error      string `json:"error,omitempty"`
}

// fleetSnap is one read of the records; behind and stragglers are worked
// out per view, against the router's map at that moment.
type fleetSnap struct {
	takenAt    time.Time
	mapVersion uint64 // the router's map when the read began
	members    []Member
	pools      []Pool
	moves      Moves
	schema     []*topo.SchemaChange
	drift      *topo.SchemaDrift
	schemaErr  error
	backups    *topo.BackupStatus
}

// Status is a router's fleet status: it holds the last snapshot of the
// records and runs one refresh at a time.
type Status struct {
	s   *zksession.Session
	p   topo.Paths
	log *zap.Logger

	mu          sync.Mutex
	ttl         time.Duration
	last        *fleetSnap
	lastErr     error     // of the last refresh; nil if it succeeded
	lastAttempt time.Time // when the last refresh began
	running     chan struct{}

	// finished moves never change: read once, kept while listed. Only the
	// running refresh touches it.
	finished map[string]Move
	reads    atomic.Int64
}

// StatusOptions tune a Status.
type StatusOptions struct {
	Logger *zap.Logger
	// TTL is how old a snapshot may be before a view reads ZooKeeper
	// again (0: DefaultTTL; negative: every view reads).
	TTL time.Duration
}

// NewStatus starts a fleet status of the cluster at p, read through s.
// It reads nothing until the first view.
func NewStatus(s *zksession.Session, p topo.Paths, opts StatusOptions) *Status {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	switch {
	case opts.TTL == 0:
		opts.TTL = DefaultTTL
	case opts.TTL < 0:
		opts.TTL = 0
	}
	return &Status{s: s, p: p, log: opts.Logger, ttl: opts.TTL, finished: map[string]Move{}}
}

// Reads counts the reads of the fleet so far (each refresh is one).
func (c *Status) Reads() int64 { return c.reads.Load() }

// Unavailable is a view with nothing to show, saying why.
func Unavailable(self Self, cluster, reason string) *View {
	return &View{Now: time.Now().UTC(), Members: []Member{}, Pools: []Pool{}, Moves: Moves{InFlight: []Move{}, Recent: []Move{}}, Schema: emptySchema(),
		Router: self, Cluster: cluster, Reason: reason}
}

// View returns the fleet view, seen from self (its map version, and
// connected: whether its ZooKeeper session is). known lists the map
// versions self keeps, oldest first, to date the stragglers. It reads
// ZooKeeper only when the last snapshot is older than the TTL or predates
// self's map, and waits (at most until ctx ends) for a read already under
// way rather than starting another. While the session is not connected it
// does not try, and serves the last snapshot marked stale.
func (c *Status) View(ctx context.Context, self Self, connected bool, known []KnownMap) *View {
	v := Unavailable(self, c.p.ClusterName(), "")
	snap, err := c.get(ctx, connected, self.MapVersion)
	if err != nil {
		v.RefreshError = err.Error()
	}
	if snap == nil {
		switch {
		case !connected:
			v.Reason = "no fleet view yet: the ZooKeeper session is " + self.ZKState
		case err != nil:
			v.Reason = "no fleet view yet: " + err.Error()
		default:
			v.Reason = "no fleet view yet"
		}
		return v
	}
	v.Available = true
	v.TakenAt = snap.takenAt.UTC()
	v.AgeSeconds = max(0, v.Now.Sub(snap.takenAt).Seconds())
	v.Stale = !connected || err != nil
	v.Moves = snap.moves
	v.Schema = schemaView(snap.schema, snap.drift, snap.schemaErr, self.SchemaNodes)
	v.Backups = snap.backups
	v.Members = make([]Member, len(snap.members))
	perPool := map[string]int{}
	for i, m := range snap.members {
		m.Self = m.Kind == KindRouter && self.ID != "" && m.Name == self.ID
		if m.Error != "" {
			m.Straggler = true
		} else if self.MapVersion > m.MapVersion {
			m.Behind = self.MapVersion - m.MapVersion
			m.Straggler = true
			m.BehindSince, m.BehindAtLeast = behindSince(known, m.MapVersion)
		}
		if m.Supervisor != nil {
			s := *m.Supervisor
			s.WorkersBehind = 0
			for _, wv := range m.workerMaps {
				if wv != 0 && wv < self.MapVersion {
					s.WorkersBehind++
				}
			}
			m.Supervisor = &s
		}
		if m.Straggler {
			v.Stragglers++
			if m.Kind == KindSupervisor {
				perPool[m.Pool]++
			}
		}
		v.Members[i] = m
	}
	v.Pools = make([]Pool, len(snap.pools))
	for i, p := range snap.pools {
		p.Stragglers = perPool[p.Name]
		v.Pools[i] = p
	}
	return v
}

// KnownMap is a map version the router applied and kept.
type KnownMap struct {
	Version uint64
	Written time.Time // the map's UpdatedAt, or when it was applied
}

// behindSince says since when a member at map version v has been behind:
// since map v+1 was written. If the router does not know v+1 (it started
// later, or skipped it), the earliest newer map it knows gives a lower
// bound (atLeast).
func behindSince(known []KnownMap, v uint64) (since time.Time, atLeast bool) {
	for _, k := range known {
		if k.Version > v {
			return k.Written, k.Version != v+1
		}
	}
	return time.Time{}, false
}

// get returns the snapshot to show, refreshing it first if it is due, and
// the error of the last refresh (nil if it succeeded).
func (c *Status) get(ctx context.Context, connected bool, mapVersion uint64) (*fleetSnap, error) {
	c.mu.Lock()
	now := time.Now()
	due := c.last == nil || now.Sub(c.last.takenAt) >= c.ttl || c.last.mapVersion != mapVersion
	if c.lastErr != nil && now.Sub(c.lastAttempt) < c.ttl {
		due = false // failed just now: do not hammer a struggling ensemble
	}
	if !connected || !due {
		snap, err := c.last, c.lastErr
		c.mu.Unlock()
		return snap, err
	}
	if c.running == nil {
		c.running = make(chan struct{})
		c.lastAttempt = now
		go c.refresh(c.running, mapVersion)
	}
	running := c.running
	c.mu.Unlock()
	select {
	case <-running:
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last, c.lastErr
}

// refresh reads the fleet (the one refresh under way) and closes done.
func (c *Status) refresh(done chan struct{}, mapVersion uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), fleetReadTimeout)
	defer cancel()
	c.reads.Add(1)
	snap, err := c.read(ctx)
	if snap != nil {
		snap.mapVersion = mapVersion
	}
	c.mu.Lock()
	if err == nil {
		c.last = snap
	} else {
		c.log.Warn("reading the fleet view", zap.Error(err))
	}
	c.lastErr = err
	c.running = nil
	c.mu.Unlock()
	close(done)
}

// read reads every member record, the pools and the moves. A record that
// does not decode is shown with its error; a failed read fails it all.
// It syncs first, so that it sees every write committed before it began
// (the session's server may be a follower behind the leader).
func (c *Status) read(ctx context.Context) (*fleetSnap, error) {
	s, p := c.s, c.p
	snap := &fleetSnap{takenAt: time.Now()}
	if err := topo.Sync(ctx, s, p); err != nil {
		return nil, err
	}
	routers, err := topo.ListRouters(ctx, s, p)
	if err != nil {
		return nil, err
	}
	for _, e := range routers {
		snap.members = append(snap.members, routerMember(e))
	}
	pools, err := topo.ListPools(ctx, s, p)
	if err != nil {
		return nil, err
	}
	for _, name := range pools {
		fp, members, err := readPool(ctx, s, p, name)
		if err != nil {
			return nil, err
		}
		snap.pools = append(snap.pools, fp)
		snap.members = append(snap.members, members...)
	}
	if snap.moves, err = c.readMoves(ctx); err != nil {
		return nil, err
	}
	snap.schema, snap.drift, snap.schemaErr = readSchema(ctx, s, p)
	// A malformed or unreadable status record is not worth the view: it
	// shows as none.
	if b, err := topo.ReadBackupStatus(ctx, s, p); err == nil {
		snap.backups = b
	} else {
		c.log.Warn("fleet status: the backup status record", zap.Error(err))
	}
	return snap, nil
}

func routerMember(e topo.Entry[topo.RouterMember]) Member {
	m := Member{Kind: KindRouter, Name: e.Name, Path: e.Path}
	if e.Err != nil {
		m.Error = e.Err.Error()
		return m
	}
	rec := e.Rec
	m.Host, m.PID, m.Addr = rec.Host, rec.PID, rec.Addr
	m.MapVersion, _ = AppliedVersion(e)
	m.StartedAt, _ = time.Parse(time.RFC3339Nano, rec.StartedAt)
	m.UpdatedAt, _ = time.Parse(time.RFC3339Nano, rec.AppliedAt)
	return m
}

func readPool(ctx context.Context, s *zksession.Session, p topo.Paths, name string) (Pool, []Member, error) {
	fp := Pool{Name: name}
	data, ver, err := topo.ReadPoolConfigData(ctx, s, p, name)
	switch {
	case err == nil:
		fp.ConfigVersion = &ver
		if cfg, err := topo.DecodePoolConfig(p.PoolConfig(name), data); err != nil {
			fp.ConfigError = err.Error()
		} else {
			fp.MapDelivery = cfg.Effective().MapDelivery.Mode
		}
	case !errors.Is(err, zksession.ErrNoNode):
		return fp, nil, err
	}
	st, err := topo.ReadPoolStatus(ctx, s, p, name)
	var re *topo.RecordError
	switch {
	case errors.As(err, &re):
		fp.StatusError = err.Error()
	case err != nil:
		return fp, nil, err
	case st != nil:
		fp.LastSwap = &Swap{Result: st.Result, Member: st.Member, Generation: st.Generation, ConfigVersion: st.ConfigVersion,
			MapVersion: st.MapVersion, SwapSeconds: st.SwapSeconds, Error: st.Error, At: st.At.UTC()}
	}
	entries, err := topo.ListPoolMembers(ctx, s, p, name)
	if err != nil {
		return fp, nil, err
	}
	members := make([]Member, 0, len(entries))
	for _, e := range entries {
		members = append(members, poolMember(name, e))
	}
	fp.Supervisors = len(members)
	return fp, members, nil
}

func poolMember(pool string, e topo.Entry[topo.PoolMember]) Member {
	m := Member{Kind: KindSupervisor, Pool: pool, Name: e.Name, Path: e.Path}
	if e.Err != nil {
		m.Error = e.Err.Error()
		return m
	}
	rec := e.Rec
	m.Host, m.PID, m.State, m.ZK = rec.Host, rec.PID, rec.State, rec.ZK
	m.MapVersion, _ = AppliedVersion(e)
	m.StartedAt, m.UpdatedAt = rec.StartedAt.UTC(), rec.UpdatedAt.UTC()
	if fs := rec.FailStatic; fs != nil {
		m.FailStatic = &FailStatic{Since: fs.Since.UTC(), Until: fs.Until.UTC(), Ongoing: fs.Until.IsZero(), Peers: fs.Peers}
	}
	sv := &Supervisor{Generation: rec.Generation, ConfigVersion: rec.ConfigVersion, MapDelivery: rec.MapDelivery,
		Accepting: rec.Accepting, TargetWorkers: rec.Target, Workers: len(rec.Workers), LastError: rec.LastError}
	for _, w := range rec.Workers {
		if w.State == "ready" {
			sv.ReadyWorkers++
			m.workerMaps = append(m.workerMaps, w.MapVersion)
		}
	}
	m.Supervisor = sv
	return m
}

// ReverseProbeStale is how old the watcher's latest probe of a reverse
// stream may be before the status page says it does not know: the
// watcher publishes one at least every 10 s.
const ReverseProbeStale = 30 * time.Second

// probed fills r, a started reverse stream, from the watcher's latest
// probe of its servers (routers cannot probe them).
func (c *Status) probed(ctx context.Context, id string, r *MoveReverse) {
	st, err := topo.ReadReverseState(ctx, c.s, c.p, id)
	switch {
	case err != nil:
		r.Reason = "its latest probe is unreadable: " + err.Error()
	case st == nil:
		r.Reason = "not probed: is a `shardctl rebalance --watch` running?"
	case time.Since(st.At) > ReverseProbeStale:
		r.Reason = fmt.Sprintf("last probed %s ago (%s): is a `shardctl rebalance --watch` running?", time.Since(st.At).Round(time.Second), st.State)
		r.ProbedAt = st.At.UTC()
	default:
		r.State, r.Reason, r.LagBytes, r.ProbedAt = st.State, st.Reason, st.LagBytes, st.At.UTC()
	}
}

// readMoves reads the move records: finished ones once (they never change
// again), the others on every refresh.
func (c *Status) readMoves(ctx context.Context) (Moves, error) {
	s, p := c.s, c.p
	out := Moves{InFlight: []Move{}, Recent: []Move{}}
	ids, err := topo.ListMoves(ctx, s, p)
	if err != nil {
		return out, err
	}
	listed := make(map[string]bool, len(ids))
	var finished []Move
	for _, id := range ids {
		listed[id] = true
		if fm, ok := c.finished[id]; ok {
			finished = append(finished, fm)
			continue
		}
		rec, _, err := topo.ReadMove(ctx, s, p, id)
		var re *topo.RecordError
		switch {
		case errors.Is(err, zksession.ErrNoNode):
			continue // deleted since listed
		case errors.As(err, &re):
			out.InFlight = append(out.InFlight, Move{ID: id, Error: err.Error(), Stragglers: []Straggler{}})
			continue
		case err != nil:
			return out, err
		}
		fm := fleetMove(rec)
		if fm.Reverse != nil && fm.Reverse.State == "started" {
			c.probed(ctx, id, fm.Reverse)
		}
		if rec.Finished() {
			c.finished[id] = fm
			finished = append(finished, fm)
		} else {
			out.InFlight = append(out.InFlight, fm)
		}
	}
	for id := range c.finished {
		if !listed[id] {
			delete(c.finished, id)
		}
	}
	slices.SortStableFunc(out.InFlight, func(a, b Move) int { return a.CreatedAt.Compare(b.CreatedAt) })
	slices.SortStableFunc(finished, func(a, b Move) int { return b.UpdatedAt.Compare(a.UpdatedAt) })
	out.Finished = len(finished)
	out.Recent = append(out.Recent, finished[:min(len(finished), fleetRecentMoves)]...)
	return out, nil
}

func fleetMove(rec *topo.MoveRecord) Move {
	fm := Move{ID: rec.ID, Error: rec.Error, Bucket: rec.Bucket, Level: rec.Level, Source: rec.Source, Target: rec.Target,
		State: rec.State, NoCopy: rec.NoCopy, CreatedAt: rec.CreatedAt.UTC(), UpdatedAt: rec.UpdatedAt.UTC(),
		RowsCopied: rec.Stats.RowsCopied, PauseMS: rec.Stats.PauseMS, MemberWaitMS: rec.Stats.MemberWaitMS,
		Stragglers: make([]Straggler, 0, len(rec.Stragglers))}
	for i := len(rec.Steps) - 1; i >= 0; i-- {
		if rec.Steps[i].State == rec.State {
			fm.StateSince = rec.Steps[i].At.UTC()
			break
		}
	}
	for _, s := range rec.Stragglers {
		fm.Stragglers = append(fm.Stragglers, Straggler{Member: s.Member, MapVersion: s.MapVersion, Error: s.Error})
	}
	fm.RollbackOf = rec.RollbackOf
	if rv := rec.Reverse; rv != nil {
		r := &MoveReverse{Lost: rv.Lost, Rollback: rv.Rollback, RollbackWanted: rv.RollbackWanted}
		switch {
		case rv.Lost != "":
			r.State = "lost"
		case rec.Finished():
			r.State = "ended"
		case rv.Enabled:
			r.State = "started"
		default:
			r.State = "pending"
		}
		if rv.Until != nil && rec.State == topo.MoveReversible {
			r.WindowUntil = rv.Until.UTC()
		}
		fm.Reverse = r
	}
	if v := rec.Verify; v != nil {
		switch {
		case v.Inconclusive:
			fm.Verify = "inconclusive"
		case v.OK:
			fm.Verify = "ok"
		default:
			fm.Verify = "mismatch"
		}
	}
	return fm
}

// readSchema reads the schema history and the last drift check. A record
// that cannot be read is said in the view, without failing it.
func readSchema(ctx context.Context, s *zksession.Session, p topo.Paths) ([]*topo.SchemaChange, *topo.SchemaDrift, error) {
	hist, err := topo.ListSchemaChanges(ctx, s, p)
	if err != nil {
		return nil, nil, err
	}
	drift, err := topo.ReadSchemaDrift(ctx, s, p)
	return hist, drift, err
}

// schemaView is the history as the status page shows it. Each change's
// state is worked out against nodes, the map's nodes not marked down or removed (a
// node added since a change shows it missing there; a node removed no
// longer counts); with nodes nil, the state recorded is shown.
func schemaView(hist []*topo.SchemaChange, drift *topo.SchemaDrift, err error, nodes []string) Schema {
	out := emptySchema()
	out.Drift = drift
	if err != nil {
		out.Error = err.Error()
	}
	out.Changes = len(hist)
	for i := len(hist) - 1; i >= 0; i-- {
		c := hist[i]
		state, missing := c.State, []string(nil)
		if nodes != nil {
			state, missing = topo.SchemaState(c, nodes)
		}
		out.ByState[state]++
		fc := SchemaChange{Seq: c.Seq, ID: c.ID, State: state, Source: c.Source, By: c.By, CreatedAt: c.CreatedAt, Applied: []string{}, Missing: map[string]string{}}
		for n, st := range c.Nodes {
			if st.State == topo.SchemaApplied {
				fc.Applied = append(fc.Applied, n)
			} else if nodes == nil || slices.Contains(nodes, n) {
				fc.Missing[n] = st.State + ": " + st.Error
			}
		}
		for _, n := range missing {
			if _, ok := fc.Missing[n]; !ok {
				fc.Missing[n] = "not run"
			}
		}
		slices.Sort(fc.Applied)
		if len(out.Recent) < schemaRecent {
			out.Recent = append(out.Recent, fc)
		}
		if state != topo.SchemaApplied {
			out.NotApplied = append(out.NotApplied, fc)
		}
	}
	return out
}

func emptySchema() Schema {
	return Schema{ByState: map[string]int{}, Recent: []SchemaChange{}, NotApplied: []SchemaChange{}}
}
