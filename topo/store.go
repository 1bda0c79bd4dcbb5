package topo

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/zksession"
)

// ErrNoCluster means the cluster record does not exist.
var ErrNoCluster = errors.New("cluster does not exist")

// ErrClusterConflict means UpdateCluster lost its compare-and-swap more
// times than it retries.
var ErrClusterConflict = errors.New("cluster record changed concurrently")

// readAs reads the record at path and decodes it, with its znode version
// for a compare-and-swap.
func readAs[T any](ctx context.Context, s *zksession.Session, path string, decode func(string, []byte) (*T, error)) (*T, int32, error) {
	data, st, err := s.Get(ctx, path)
	if err != nil {
		return nil, 0, err
	}
	r, err := decode(path, data)
	if err != nil {
		return nil, 0, err
	}
	return r, st.Version, nil
}

// ReadCluster reads and validates a cluster's record.
func ReadCluster(ctx context.Context, s *zksession.Session, p Paths) (*ClusterRecord, error) {
	r, _, err := readCluster(ctx, s, p)
	return r, err
}

func readCluster(ctx context.Context, s *zksession.Session, p Paths) (*ClusterRecord, int32, error) {
	r, ver, err := readAs(ctx, s, p.Cluster(), DecodeCluster)
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, 0, hint.New(fmt.Errorf("%w: no record at %s", ErrNoCluster, p.Cluster()), "create it with `shardctl init`")
	}
	return r, ver, err
}

// UpdateCluster applies edit to a copy of the cluster record and writes it
// back by compare-and-swap on the znode version, re-reading and re-applying
// edit (which must decide from the record it is given) up to 5 times when
// another writer got there first. The name and seed can never change: an
// edit that touches them is refused. A record with tables is written in
// format 2.
func UpdateCluster(ctx context.Context, s *zksession.Session, p Paths, edit func(r *ClusterRecord) error) (*ClusterRecord, error) {
	const retries = 5
	for attempt := 0; attempt <= retries; attempt++ {
		cur, zv, err := readCluster(ctx, s, p)
		if err != nil {
			return nil, err
		}
		next := *cur
		next.Tables = append([]TableRecord(nil), cur.Tables...)
		if err := edit(&next); err != nil {
			return nil, err
		}
		if next.Name != cur.Name || next.Seed != cur.Seed || !next.CreatedAt.Equal(cur.CreatedAt) {
			return nil, fmt.Errorf("cluster record at %s: the name, seed and creation time never change", p.Cluster())
		}
		if len(next.Tables) > 0 && next.Version < 2 {
			next.Version = 2
		}
		if err := next.validate(); err != nil {
			return nil, fmt.Errorf("cluster record at %s: %w", p.Cluster(), err)
		}
		data, err := Encode(next)
		if err != nil {
			return nil, err
		}
		if _, err := s.Set(ctx, p.Cluster(), data, zv); err != nil {
			if errors.Is(err, zksession.ErrBadVersion) {
				continue
			}
			return nil, err
		}
		return &next, nil
	}
	return nil, fmt.Errorf("%w at %s (gave up after %d attempts)", ErrClusterConflict, p.Cluster(), retries+1)
}

// Sync makes the server this session talks to catch up with the leader,
// so that the reads that follow see every write another process committed
// before it (ZooKeeper gives read-your-writes only within one session).
// Used after a session loss and on reload, before re-reading records.
func Sync(ctx context.Context, s *zksession.Session, p Paths) error {
	err := s.Sync(ctx, p.Cluster())
	if errors.Is(err, zksession.ErrNoNode) {
		return nil // no cluster yet: nothing to catch up on
	}
	return err
}

// AddTable adds t to the cluster's sharded tables (UpdateCluster: by
// compare-and-swap, re-applied on a conflict). A table already sharded is
// an error.
func AddTable(ctx context.Context, s *zksession.Session, p Paths, t TableRecord) (*ClusterRecord, error) {
	return UpdateCluster(ctx, s, p, func(r *ClusterRecord) error {
		if slices.ContainsFunc(r.Tables, func(x TableRecord) bool { return x.Name == t.Name }) {
			return fmt.Errorf("table %s is already sharded", t.Name)
		}
		r.Tables = append(r.Tables, t)
		return nil
	})
}

// RemoveTable takes the table called name out of the cluster's sharded
// tables, as AddTable adds one. A table that is not sharded is an error.
func RemoveTable(ctx context.Context, s *zksession.Session, p Paths, name string) (*ClusterRecord, error) {
	return UpdateCluster(ctx, s, p, func(r *ClusterRecord) error {
		i := slices.IndexFunc(r.Tables, func(x TableRecord) bool { return x.Name == name })
		if i < 0 {
			return fmt.Errorf("table %s is not a sharded table", name)
		}
		r.Tables = slices.Delete(r.Tables, i, i+1)
		return nil
	})
}
