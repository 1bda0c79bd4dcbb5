package bucketmap

import (
	"encoding/json"

	"github.com/shardvisor/shardvisor/topo"
)

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
// hex seed) and its bucket map record's JSON (DecodeRecord). It is the one
// encoder of the format, for the supervisor's files and the router's
// GET /v1/map alike. Compact, so that the embedded map keeps the bytes it
// has in ZooKeeper (Encode writes it compact) and a large map does not
// grow by its indentation.
func EncodeMapFile(cluster, seed string, rawMap []byte) ([]byte, error) {
	return topo.EncodeCompact(MapFileRecord{Version: MapFileVersion, Cluster: cluster, Seed: seed, Map: rawMap})
}

// DecodeMapFile decodes the JSON strictly; the embedded map is checked by
// Decode.
func DecodeMapFile(path string, data []byte) (*MapFileRecord, error) {
	var r MapFileRecord
	if err := topo.Decode("map file", path, data, MapFileVersion, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
