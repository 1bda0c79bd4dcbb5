package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/topo"
)

// MapDocument validates the bucket map bytes read from ZooKeeper (strictly,
// with bucketmap.DecodeRecord: a map that fails is never handed to workers)
// and returns its version and the map file document workers get: the
// cluster's seed with the map record's plain JSON (as stored, or inflated
// when the znode holds it compressed), so that a worker routes users with
// nothing but this file (bucketmap.MapFileRecord, docs/router-api.md).
func MapDocument(cluster *topo.ClusterRecord, znode string, data []byte) (uint64, []byte, error) {
	m, js, err := bucketmap.DecodeRecord(znode, data)
	if err != nil {
		return 0, nil, err
	}
	doc, err := bucketmap.EncodeMapFile(cluster.Name, cluster.Seed, js)
	if err != nil {
		return 0, nil, err
	}
	return m.Version, doc, nil
}

const mapFilePrefix = "map-"

func mapFileName(dir string, version uint64) string {
	return filepath.Join(dir, fmt.Sprintf("%s%d.json", mapFilePrefix, version))
}

// liveMapName is the reload mode's map file: one path for the life of the
// supervisor, replaced atomically by every new map.
func liveMapName(dir string) string { return filepath.Join(dir, "live-map.json") }

func writeLiveMapFile(dir string, data []byte) error {
	return replaceFile(liveMapName(dir), data)
}

// writeMapFile writes the map bytes for workers of swap mode, one file per
// map version.
func writeMapFile(dir string, version uint64, data []byte) (string, error) {
	final := mapFileName(dir, version)
	if old, err := os.ReadFile(final); err == nil && string(old) == string(data) {
		return final, nil
	}
	return final, replaceFile(final, data)
}

// replaceFile writes data to final: temp file, fsync, rename, fsync of the
// directory. A worker that opens the path sees the whole old or the whole
// new content (or, before the first rename, no file), never a partial one.
func replaceFile(final string, data []byte) error {
	dir := filepath.Dir(final)
	tmp, err := os.CreateTemp(dir, ".map-*.tmp")
	if err != nil {
		return fmt.Errorf("writing map file: %w", err)
	}
	fail := func(err error) error {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("writing map file %s: %w", final, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing map file %s: %w", final, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// removeMapFiles deletes map files whose version is not in keep.
func removeMapFiles(dir string, keep map[uint64]bool) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, mapFilePrefix) || !strings.HasSuffix(name, ".json") {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(name, mapFilePrefix), ".json"), 10, 64)
		if err != nil || keep[v] {
			continue
		}
		if os.Remove(filepath.Join(dir, name)) == nil {
			removed = append(removed, name)
		}
	}
	return removed
}
