package topo

import (
	"context"
	"errors"
	"fmt"

	"github.com/shardvisor/shardvisor/internal/zksession"
)

// ErrNoCluster means the cluster record does not exist.
var ErrNoCluster = errors.New("cluster does not exist")

// ReadCluster reads and validates a cluster's record.
func ReadCluster(ctx context.Context, s *zksession.Session, p Paths) (*ClusterRecord, error) {
	data, _, err := s.Get(ctx, p.Cluster())
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, fmt.Errorf("%w: no record at %s (create it with `shardctl init`)", ErrNoCluster, p.Cluster())
	}
	if err != nil {
		return nil, err
	}
	return DecodeCluster(p.Cluster(), data)
}
