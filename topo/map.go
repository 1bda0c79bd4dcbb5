package topo

import "time"

// MapFormatVersion is the newest bucket map format this build writes.
const MapFormatVersion = 1

// MapRecord is the wire form of the bucket map at Paths.Map(). Package
// bucketmap turns it into a validated bucketmap.Map and back; this struct
// only fixes the JSON. See docs/bucket-map.md.
//
// The map must stay well under ZooKeeper's 1 MiB limit at 2^16 buckets, so
// per-bucket data is packed: owners is a base64 string of one big-endian
// uint16 per bucket (an index into nodes), only buckets that are not plainly
// active are listed in buckets, and history is kept as bucket ranges so that
// a split doubles bounds instead of duplicating entries.
type MapRecord struct {
	Version    int             `json:"version"`
	MapVersion uint64          `json:"map_version"`
	Level      int             `json:"level"`
	UpdatedAt  time.Time       `json:"updated_at"`
	Nodes      []NodeRecord    `json:"nodes"`
	Owners     string          `json:"owners"`
	Buckets    []BucketRecord  `json:"buckets,omitempty"`
	History    []HandoffRecord `json:"history,omitempty"`
}

// NodeRecord is one db node in the registry. The DSN never carries a
// password; Password is a reference to where it comes from.
type NodeRecord struct {
	ID       string `json:"id"`
	DSN      string `json:"dsn"`
	Password string `json:"password,omitempty"` // "env:NAME" or "file:/path"
	Weight   int    `json:"weight"`
	State    string `json:"state"` // active, draining, down, removed
}

// BucketRecord is a bucket that is not plainly active.
type BucketRecord struct {
	Bucket   uint32 `json:"bucket"`
	State    string `json:"state"`            // active or moving
	Target   string `json:"target,omitempty"` // moving: the node it moves to
	Move     string `json:"move,omitempty"`   // moving: the move record id
	Since    uint64 `json:"since,omitempty"`  // map version at which the state began
	DataLost bool   `json:"data_lost,omitempty"`
}

// HandoffRecord says that node owned buckets lo..hi (inclusive, at the
// map's level) until map version until_version, at time at. GC uses it to
// know what it may delete from node, and when.
type HandoffRecord struct {
	Lo           uint32    `json:"lo"`
	Hi           uint32    `json:"hi"`
	Node         string    `json:"node"`
	UntilVersion uint64    `json:"until_version"`
	At           time.Time `json:"at"`
}

// DecodeMapRecord decodes the JSON strictly; semantic checks are
// bucketmap's.
func DecodeMapRecord(znode string, data []byte) (*MapRecord, error) {
	return decodeAs[MapRecord]("bucket map", znode, data, MapFormatVersion, nil)
}
