package topo

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/zksession"
)

// The cluster's tree and its bucket map record. The map's bytes are
// package bucketmap's (a layer above, which decodes and validates them);
// this file owns where they live and how they are written: created with
// the cluster, then only by compare-and-swap.

// ErrClusterExists means CreateCluster found a cluster already there.
var ErrClusterExists = errors.New("cluster already exists")

// ErrMapChanged means a write of the map lost its compare-and-swap: another
// writer changed the map since it was read. It comes wrapped together with
// zksession.ErrBadVersion.
var ErrMapChanged = errors.New("bucket map changed since it was read")

// CreateCluster writes a new cluster: its record, its first map (mapData,
// as encoded by bucketmap), the directories of the layout and, with ACLs,
// the ACL record, in one transaction, so that a cluster is never
// half-created. acl is the ACL of the cluster's znode
// (zksession.ClusterACL; nil: open), from which every other znode's is
// derived (ACLRule). It refuses, with an error wrapping ErrClusterExists,
// to touch an existing one.
func CreateCluster(ctx context.Context, s *zksession.Session, p Paths, rec ClusterRecord, mapData []byte, acl []zk.ACL) error {
	if rec.Name != p.ClusterName() {
		return fmt.Errorf("cluster record names %q, the path is for %q", rec.Name, p.ClusterName())
	}
	crec, err := Encode(rec)
	if err != nil {
		return err
	}
	if _, err := DecodeCluster(p.Cluster(), crec); err != nil {
		return err
	}
	exists := fmt.Errorf("%w at %s; refusing to overwrite it", ErrClusterExists, p.Cluster())
	if ok, _, err := s.Exists(ctx, p.Cluster()); err != nil {
		return err
	} else if ok {
		return exists
	}
	rule, err := NewACLRule(acl)
	if err != nil {
		return err
	}
	if err := createDir(ctx, s, p, p.Root()); err != nil {
		return err
	}
	nodes := []newNode{{p.Cluster(), crec}, {p.Map(), mapData}, {p.Pools(), nil}, {p.Routers(), nil}, {p.Moves(), nil}, {p.Locks(), nil}}
	if !rule.Open() && !rule.X509() { // x509 readers derive the rule themselves
		data, err := aclRecordFor(rule)
		if err != nil {
			return err
		}
		nodes = append(nodes, newNode{p.ACLRecord(), data})
	}
	if err := createTogether(ctx, s, p, rule, nodes...); err != nil {
		if errors.Is(err, zksession.ErrNodeExists) {
			return exists // created by someone else since the check
		}
		return err
	}
	rememberRule(s, p, rule)
	return nil
}

// DeleteCluster deletes the cluster's whole tree (not atomic). For tests
// and tools that tear a cluster down.
func DeleteCluster(ctx context.Context, s *zksession.Session, p Paths) error {
	rememberRule(s, p, nil)
	return s.DeleteAll(ctx, p.Cluster())
}

// DeleteRoot deletes p.Root() and everything below it, every cluster
// included. Only for benchmarks and tests that made a root of their own.
func DeleteRoot(ctx context.Context, s *zksession.Session, p Paths) error {
	return s.DeleteAll(ctx, p.Root())
}

// ReadMapData reads the bucket map record's bytes as stored, with its
// znode version for a later WriteMapData. A missing map is an error
// wrapping ErrNoCluster.
func ReadMapData(ctx context.Context, s *zksession.Session, p Paths) ([]byte, int32, error) {
	data, st, err := s.Get(ctx, p.Map())
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, 0, hint.New(fmt.Errorf("%w: no bucket map at %s", ErrNoCluster, p.Map()), "create the cluster with `shardctl init`")
	}
	if err != nil {
		return nil, 0, err
	}
	return data, st.Version, nil
}

// WriteMapData writes the map record by compare-and-swap on version (from
// ReadMapData or the previous write) and returns the new version. also
// are more operations (topo.UpdateMoveOp) written in the same transaction,
// all or nothing; their stats follow. A lost compare-and-swap on the map
// itself wraps ErrMapChanged (and zksession.ErrBadVersion); a failure of
// one of also's operations is returned as it is, so that the caller can
// tell the two apart (only the first is worth re-reading the map for).
func WriteMapData(ctx context.Context, s *zksession.Session, p Paths, data []byte, version int32, also ...zksession.Op) (int32, []zksession.Stat, error) {
	var stats []zksession.Stat
	var err error
	if len(also) == 0 {
		var st zksession.Stat
		st, err = s.Set(ctx, p.Map(), data, version)
		stats = []zksession.Stat{st}
	} else {
		stats, err = s.Multi(ctx, append([]zksession.Op{zksession.SetOp(p.Map(), data, version)}, also...)...)
	}
	if err != nil {
		var oe *zksession.OpError
		if errors.Is(err, zksession.ErrBadVersion) && errors.As(err, &oe) && oe.Path == p.Map() {
			return 0, nil, fmt.Errorf("%w: %w", ErrMapChanged, err)
		}
		return 0, nil, err
	}
	return stats[0].Version, stats[1:], nil
}
