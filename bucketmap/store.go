package bucketmap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// ErrConflict means a compare-and-swap lost to a concurrent writer more
// times than the caller allowed.
var ErrConflict = errors.New("bucket map changed concurrently")

// ErrClusterExists means init found a cluster already there.
var ErrClusterExists = topo.ErrClusterExists

// Store reads and writes one cluster's map in ZooKeeper.
type Store struct {
	s *zksession.Session
	p topo.Paths
	// Retries is how many times Update re-reads and re-applies its edit
	// after losing a compare-and-swap (default 5).
	Retries int
	// Now is the clock, for tests.
	Now func() time.Time
}

// NewStore returns a store for the cluster at p.
func NewStore(s *zksession.Session, p topo.Paths) *Store {
	return &Store{s: s, p: p, Retries: 5, Now: time.Now}
}

// Paths returns the cluster's paths.
func (st *Store) Paths() topo.Paths { return st.p }

// Session returns the store's session.
func (st *Store) Session() *zksession.Session { return st.s }

// CreateOptions qualify Create.
type CreateOptions struct {
	// ACL is the ACL of the cluster's znode (zksession.ClusterACL), from
	// which every znode of the cluster takes its own (topo.ACLRule); nil:
	// open.
	ACL []zk.ACL
}

// Create writes a new cluster: its record, its first map, and the
// directories of the layout, in one transaction (topo.CreateCluster). It
// refuses to touch an existing cluster.
func (st *Store) Create(ctx context.Context, rec topo.ClusterRecord, m *Map, opt CreateOptions) error {
	mrec, err := Encode(m)
	if err != nil {
		return err
	}
	return topo.CreateCluster(ctx, st.s, st.p, rec, mrec, opt.ACL)
}

// Load reads and validates the current map, with its znode version for a
// later compare-and-swap.
func (st *Store) Load(ctx context.Context) (*Map, int32, error) {
	data, zv, err := topo.ReadMapData(ctx, st.s, st.p)
	if err != nil {
		return nil, 0, err
	}
	m, err := Decode(st.p.Map(), data)
	if err != nil {
		return nil, 0, err
	}
	return m, zv, nil
}

// Update applies edit to a copy of the current map and writes it back by
// compare-and-swap. The copy's Version is already the new version and its
// UpdatedAt the current time when edit runs. If another writer got there
// first, Update re-reads and re-applies edit (which must therefore decide
// from the map it is given, not from earlier reads), up to Retries times,
// then fails with ErrConflict. A map that fails validation is never written.
func (st *Store) Update(ctx context.Context, edit func(m *Map) error) (*Map, error) {
	next, _, _, err := st.UpdateAlso(ctx, nil, 0, edit, nil)
	return next, err
}

// UpdateAlso is Update with two additions for a caller on a hot path (a
// move's flip, inside its write pause):
//
//   - from, if not nil, is a map the caller already holds with its znode
//     version zv: the first attempt edits it without reading ZooKeeper;
//     a conflict, or an edit that fails on it, falls back to reading.
//   - also, if not nil, returns more operations (a move record) written in
//     the same ZooKeeper transaction as the map, all or nothing; it sees
//     the edited map. If one of them fails (its own version moved on), the
//     map is not written either and the error is returned, not retried.
//
// It returns the new map, its znode version, and the stats of also's
// operations. Without also, an edit that leaves the map as it was (but for
// its version and time) writes nothing and returns the current map and
// znode version.
func (st *Store) UpdateAlso(ctx context.Context, from *Map, zv int32, edit func(m *Map) error, also func(next *Map) ([]zksession.Op, error)) (*Map, int32, []zksession.Stat, error) {
	var lastErr error
	retries := st.Retries
	if from != nil {
		retries++ // the first attempt, on the caller's map, is free
	}
	for attempt := 0; attempt <= retries; attempt++ {
		cur := from
		if attempt > 0 || cur == nil {
			var err error
			if cur, zv, err = st.Load(ctx); err != nil {
				return nil, 0, nil, err
			}
		}
		next := cur.Clone()
		next.Version = cur.Version + 1
		next.UpdatedAt = st.Now().UTC()
		if err := edit(next); err != nil {
			if attempt == 0 && from != nil {
				// The caller's map may be stale: judge by the current one.
				lastErr = err
				continue
			}
			return nil, 0, nil, err
		}
		data, err := Encode(next)
		if err != nil {
			return nil, 0, nil, err
		}
		if also == nil && (attempt > 0 || from == nil) {
			// An edit that changes nothing writes nothing: a new version
			// goes to every router, supervisor and fence reconciler, and
			// a caller retrying an idempotent edit (an abort's cleanup
			// while a node is away) would otherwise churn the map. Judged
			// on a map read from ZooKeeper, not on the caller's (stale?)
			// one.
			if same, err := sameContent(cur, next); err != nil {
				return nil, 0, nil, err
			} else if same {
				return cur, zv, nil, nil
			}
		}
		var ops []zksession.Op
		if also != nil {
			if ops, err = also(next); err != nil {
				return nil, 0, nil, err
			}
		}
		nzv, stats, err := topo.WriteMapData(ctx, st.s, st.p, data, zv, ops...)
		if err != nil {
			// Only a lost race on the map itself is worth re-reading for:
			// also's records moving on is the caller's to judge.
			if errors.Is(err, topo.ErrMapChanged) {
				lastErr = fmt.Errorf("%w: the write based on map version %d lost to another writer", ErrConflict, cur.Version)
				continue
			}
			return nil, 0, nil, err
		}
		return next, nzv, stats, nil
	}
	return nil, 0, nil, fmt.Errorf("%w (gave up after %d attempts)", lastErr, retries+1)
}

// sameContent reports whether next, an edited copy of cur, holds what cur
// holds: the same record once cur takes next's version and time.
func sameContent(cur, next *Map) (bool, error) {
	if cur.Encoding != next.Encoding {
		return false, nil
	}
	probe := cur.Clone()
	probe.Version, probe.UpdatedAt = next.Version, next.UpdatedAt
	a, err := EncodeJSON(probe)
	if err != nil {
		return false, nil // cur at next's version is no valid map: a change
	}
	b, err := EncodeJSON(next)
	if err != nil {
		return false, err
	}
	return bytes.Equal(a, b), nil
}

// SetEncoding switches how the map record is stored (MapEncoding) by
// writing it again, at the next map version, in enc; every later write
// keeps enc, since writers re-encode the record in the form they read.
// A map already stored in enc is not written: changed is false.
//
// Compress only once every process that reads the map (routers, apps
// embedding package router, supervisors, shardctl, the mover, the
// rebalancer, GC) runs a release that reads both forms: an older one
// refuses a compressed record and keeps its last map. Switching back to
// plain is the way back before downgrading any of them.
func (st *Store) SetEncoding(ctx context.Context, enc MapEncoding) (m *Map, changed bool, err error) {
	if _, err := ParseMapEncoding(string(enc)); err != nil {
		return nil, false, err
	}
	cur, _, err := st.Load(ctx)
	if err != nil {
		return nil, false, err
	}
	if cur.Encoding == enc {
		return cur, false, nil
	}
	next, err := st.Update(ctx, func(m *Map) error {
		m.Encoding = enc
		return nil
	})
	return next, err == nil, err
}

// MapPath is where the map lives, for watchers.
func (st *Store) MapPath() string { return st.p.Map() }

// Destroy deletes the whole cluster tree. For tests and benchmarks (no
// command deletes a cluster).
func (st *Store) Destroy(ctx context.Context) error {
	return topo.DeleteCluster(ctx, st.s, st.p)
}
