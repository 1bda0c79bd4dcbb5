package testkit

import (
	"testing"
	"time"
)

// ReportRatio ends a benchmark that timed a baseline and an alternative
// over b.N operations each, interleaved so that a burst of load or a drift
// of CPU frequency hits both alike. It reports the alternative's time as a
// multiple of the baseline's (the metric ratioUnit, "x-<baseline>") and
// each one's nanoseconds per operation (baseUnit and altUnit,
// "<name>-ns/<op>"), and returns the ratio.
func ReportRatio(b *testing.B, base, alt time.Duration, ratioUnit, baseUnit, altUnit string) float64 {
	b.Helper()
	b.StopTimer()
	ratio := float64(alt) / float64(max(base, 1))
	b.ReportMetric(ratio, ratioUnit)
	b.ReportMetric(float64(base.Nanoseconds())/float64(b.N), baseUnit)
	b.ReportMetric(float64(alt.Nanoseconds())/float64(b.N), altUnit)
	return ratio
}
