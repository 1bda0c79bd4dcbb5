package bucketmap

// at is bucket n at the map's level: how tests of maps at one depth name
// buckets.
func at(m *Map, n uint32) Bucket { return Bucket{n, m.Level} }
