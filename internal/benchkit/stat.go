package benchkit

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Stat is a distribution's nearest-rank percentiles.
type Stat struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Of summarizes xs (left unchanged); the zero Stat when xs is empty.
func Of(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return Stat{N: len(s), P50: rank(0.50), P99: rank(0.99), Max: s[len(s)-1]}
}

// OfDurations summarizes ds in milliseconds (MS), as Of.
func OfDurations(ds []time.Duration) Stat {
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = MS(d)
	}
	return Of(ms)
}

// MS is s as a report's line of milliseconds; "n/a" when s is empty.
func (s Stat) MS() string {
	if s.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf("p50 %7.1f  p99 %7.1f  max %7.1f ms  (n=%d)", s.P50, s.P99, s.Max, s.N)
}
