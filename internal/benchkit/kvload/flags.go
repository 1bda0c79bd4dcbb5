package kvload

import "flag"

// Flags are the load's flags, declared alike by the benchmarks that run
// it.
type Flags struct {
	Writers    *int
	InsertFrac *float64
}

// NewFlags declares -writers (writers by default; how, when not empty,
// says how they are paced) and -insert-frac.
func NewFlags(writers int, how string) Flags {
	help := "write-load goroutines"
	if how != "" {
		help += " (" + how + ")"
	}
	return Flags{
		Writers:    flag.Int("writers", writers, help),
		InsertFrac: flag.Float64("insert-frac", 0.25, "fraction of writes that insert a new user (the rest update a loaded one)"),
	}
}
