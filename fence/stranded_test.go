package fence

import (
	"testing"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/keystream"
)

// The buckets a node lost without a copy, merged; a copying handoff and a
// node that never owned them are not stranded.
func TestStrandedRanges(t *testing.T) {
	m := testMap(t, 3, "pg1", "pg2", "pg3") // pg1 0..2, pg2 3..5, pg3 6..7
	if err := m.Assign(bucketmap.Bucket{Prefix: 0, Depth: m.Level}, "pg3", bucketmap.AssignOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.MarkDown("pg2"); err != nil {
		t.Fatal(err)
	}
	got := StrandedRanges(m, "pg2")
	lo, _, _ := keystream.Range(3, 3)
	_, hi, _ := keystream.Range(3, 5)
	if len(got) != 1 || got[0] != [2]int64{lo, hi} {
		t.Fatalf("pg2: %v, want one range %d..%d", got, lo, hi)
	}
	for _, id := range []bucketmap.NodeID{"pg1", "pg3"} {
		if got := StrandedRanges(m, id); len(got) != 0 {
			t.Errorf("%s: %v, want none (bucket 0 went by a copy)", id, got)
		}
	}
}
