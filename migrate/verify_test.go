package migrate

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/keystream"
)

// A bucket's chunks by shift are width_bucket's: chunkExpr's shift and
// chunkRange's bounds agree for every level a map can have, and another
// range falls back to width_bucket.
func TestChunksOfABucket(t *testing.T) {
	for level := 0; level <= 20; level++ {
		for _, b := range []uint32{0, 1, uint32(1)<<level - 1} {
			if int64(b) >= int64(1)<<level {
				continue
			}
			lo, hi, err := keystream.Range(level, b)
			if err != nil {
				t.Fatal(err)
			}
			expr := chunkExpr("k", lo, hi)
			i := strings.Index(expr, ">> ")
			if i < 0 {
				t.Fatalf("level %d bucket %d: %s, want a shift", level, b, expr)
			}
			var k int
			if _, err := fmt.Sscanf(expr[i:], ">> %d)", &k); err != nil {
				t.Fatalf("%s: %v", expr, err)
			}
			span := uint64(hi-lo) + 1 // 0: the whole key space (level 0)
			rng := rand.New(rand.NewPCG(uint64(level), uint64(b)))
			for range 500 {
				key := int64(rng.Uint64())
				if span != 0 {
					key = lo + int64(rng.Uint64()%span)
				}
				c := int((key>>k)-(lo>>k)) + 1
				clo, chi := chunkRange(lo, hi, c)
				if c < 1 || c > verifyChunks || key < clo || key > chi {
					t.Fatalf("level %d bucket %d key %d: chunk %d is %d..%d", level, b, key, c, clo, chi)
				}
			}
		}
	}
	if expr := chunkExpr("k", 0, 999); !strings.Contains(expr, "width_bucket") {
		t.Fatalf("a range of 1000 keys: %s", expr)
	}
}
