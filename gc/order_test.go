package gc

import (
	"math"
	"testing"
)

// heapOrder takes heap order only when key-order batches would visit more
// pages than a walk of the whole table.
func TestHeapOrderRule(t *testing.T) {
	for _, c := range []struct {
		name                         string
		rows, blocks, sampled, pages int64
		want                         bool
	}{
		// 1M rows on 8,334 pages, batches of 20,000.
		{"whole table, random layout", 1_000_000, 8334, 20_000, 7600, true},
		{"whole table, key layout", 1_000_000, 8334, 20_000, 167, true},
		{"1/16 of a random table", 62_500, 8334, 20_000, 7600, true},
		{"1/16 of a key-ordered table", 62_500, 8334, 20_000, 167, false},
		{"half of a key-ordered table", 500_000, 8334, 20_000, 167, false},
		{"a few rows of a random table", 900, 8334, 900, 880, false},
		{"empty sample", 1_000_000, 8334, 0, 0, false},
		{"empty table", 0, 0, 0, 0, false},
	} {
		if got := heapOrder(c.rows, c.blocks, c.sampled, c.pages); got != c.want {
			t.Errorf("%s: heap order %v, want %v", c.name, got, c.want)
		}
	}
}

// The first batch's sub-range is about batch/rows of the range, never
// empty, never past its end, also for the whole key space.
func TestFirstBatch(t *testing.T) {
	for _, c := range []struct {
		lo, hi   int64
		rows     int64
		batch    int
		wantFrac float64
	}{
		{0, 1 << 40, 1000, 100, 0.1},
		{math.MinInt64, math.MaxInt64, 1_000_000, 20_000, 0.02},
		{math.MinInt64, math.MaxInt64, 10, 20_000, 1},
		{-100, 100, 10, 20_000, 1},
		{5, 5, 1_000_000, 1, 1},
	} {
		lo, hi := firstBatch(c.lo, c.hi, c.rows, c.batch)
		if c.wantFrac == 1 && hi != c.hi {
			t.Errorf("%+v: a range of few rows is one batch, got %d..%d", c, lo, hi)
		}
		if lo != c.lo || hi < lo || hi > c.hi {
			t.Fatalf("%+v: got %d..%d", c, lo, hi)
		}
		frac := (float64(hi) - float64(lo) + 1) / (float64(c.hi) - float64(c.lo) + 1)
		if math.Abs(frac-c.wantFrac) > 0.01 {
			t.Errorf("%+v: sub-range is %.4f of the range, want %.2f", c, frac, c.wantFrac)
		}
	}
}
