//go:build race

package keystream

// raceEnabled reports whether the race detector is on; under it sync.Pool
// deliberately drops items, so allocation counts are meaningless.
const raceEnabled = true
