package fleet

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// behindSince dates a straggler by the first map above its version when
// the router knows that map, else by the earliest newer one it knows, as
// a lower bound.
func TestBehindSince(t *testing.T) {
	known := []KnownMap{{5, t0}, {7, t0.Add(time.Minute)}, {8, t0.Add(2 * time.Minute)}}
	for _, tc := range []struct {
		v       uint64
		since   time.Time
		atLeast bool
	}{
		{4, t0, false},
		{2, t0, true},
		{5, t0.Add(time.Minute), true}, // 6 was skipped: 7 was applied after it
		{6, t0.Add(time.Minute), false},
		{7, t0.Add(2 * time.Minute), false},
		{8, time.Time{}, false},
	} {
		since, atLeast := behindSince(known, tc.v)
		if !since.Equal(tc.since) || atLeast != tc.atLeast {
			t.Errorf("behindSince(%d) = %s %v, want %s %v", tc.v, since, atLeast, tc.since, tc.atLeast)
		}
	}
}
