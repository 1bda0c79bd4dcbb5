package topo

import "encoding/json"

// MapFileVersion is the newest map file format this build writes.
const MapFileVersion = 1

// MapFileRecord is the self-contained routing table handed to workers
// (the file named by SHARDVISOR_MAP_FILE) and served by the router at
// GET /v1/map: the cluster's seed with the bucket map exactly as stored in
// ZooKeeper, so that an app in any language can route a user with the
// keystream reference and this one file.
type MapFileRecord struct {
	Version int             `json:"version"`
	Cluster string          `json:"cluster"`
	Seed    string          `json:"seed"`
	Map     json.RawMessage `json:"map"`
}

// EncodeMapFile renders the map file document of a cluster (its name and
// hex seed) and its bucket map record as read from ZooKeeper. It is the one
// encoder of the format, for the supervisor's files and the router's
// GET /v1/map alike. Compact, so that the embedded map keeps the bytes it
// has in ZooKeeper (bucketmap writes it compact) and a large map does not
// grow by its indentation.
func EncodeMapFile(cluster, seed string, rawMap []byte) ([]byte, error) {
	return EncodeCompact(MapFileRecord{Version: MapFileVersion, Cluster: cluster, Seed: seed, Map: rawMap})
}

// DecodeMapFile decodes the JSON strictly; the embedded map is checked by
// bucketmap.Decode.
func DecodeMapFile(path string, data []byte) (*MapFileRecord, error) {
	return decodeAs[MapFileRecord]("map file", path, data, MapFileVersion, nil)
}

// RouterMemberVersion is the newest router member record format.
const RouterMemberVersion = 1

// RouterMember is a router's ephemeral record at Paths.Router(id): which
// map version it has applied, so that a move can wait until every live
// router has seen the map that pauses a bucket.
type RouterMember struct {
	Version    int    `json:"version"`
	ID         string `json:"id"`
	Host       string `json:"host"`
	PID        int    `json:"pid"`
	Addr       string `json:"addr,omitempty"`
	MapVersion uint64 `json:"map_version"`
	StartedAt  string `json:"started_at"`
	AppliedAt  string `json:"applied_at,omitempty"`
}

// DecodeRouterMember decodes a router member record.
func DecodeRouterMember(path string, data []byte) (*RouterMember, error) {
	return decodeAs[RouterMember]("router member", path, data, RouterMemberVersion, nil)
}
