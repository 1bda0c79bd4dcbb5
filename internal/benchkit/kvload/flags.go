package kvload

import (
	"flag"

	"github.com/shardvisor/shardvisor/internal/benchkit"
)

// Flags are the load's flags, declared alike by the benchmarks that run
// it: the map's level (Options.Level), the writers and their inserts.
type Flags struct {
	Level      *int
	Writers    *int
	InsertFrac *float64
}

// NewFlags declares -level (benchkit.LevelFlag), -writers (writers by
// default; how, when not empty, says how they are paced) and -insert-frac.
func NewFlags(level int, levelNote string, writers int, how string) Flags {
	help := "write-load goroutines"
	if how != "" {
		help += " (" + how + ")"
	}
	return Flags{
		Level:      benchkit.LevelFlag(level, levelNote),
		Writers:    flag.Int("writers", writers, help),
		InsertFrac: flag.Float64("insert-frac", 0.25, "fraction of writes that insert a new user (the rest update a loaded one)"),
	}
}
