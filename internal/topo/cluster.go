package topo

import (
	"encoding/hex"
	"fmt"
	"time"
)

// ClusterVersion is the newest ClusterRecord format this build writes.
const ClusterVersion = 1

// ClusterRecord is stored at Paths.Cluster(). It is written once by
// `shardctl init`; the seed never changes afterwards, because changing it
// would move every user to another bucket.
type ClusterRecord struct {
	Version   int       `json:"version"`
	Name      string    `json:"name"`
	Seed      string    `json:"seed"` // hex keystream seed
	CreatedAt time.Time `json:"created_at"`
}

// DecodeCluster decodes and validates a ClusterRecord.
func DecodeCluster(znode string, data []byte) (*ClusterRecord, error) {
	var r ClusterRecord
	if err := Decode("cluster record", znode, data, ClusterVersion, &r); err != nil {
		return nil, err
	}
	bad := func(format string, args ...any) error {
		return &RecordError{Kind: "cluster record", Path: znode, Err: fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)}
	}
	if err := ValidName("cluster", r.Name); err != nil {
		return nil, bad("%v", err)
	}
	if _, err := hex.DecodeString(r.Seed); err != nil || r.Seed == "" {
		return nil, bad("seed %q is not hex", r.Seed)
	}
	return &r, nil
}
