package benchkit

import "flag"

// LevelFlag declares -level, the map's level (2^level buckets), as every
// benchmark that builds a map names it; note, when not empty, says what
// the default means in this benchmark.
func LevelFlag(def int, note string) *int {
	help := "map level: 2^level buckets"
	if note != "" {
		help += " (" + note + ")"
	}
	return flag.Int("level", def, help)
}
