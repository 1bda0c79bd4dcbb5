package main

import (
	"sync"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/benchkit/kvload"
)

// tracker records, from the router's applied maps, when each bucket was
// moving: writes to it wait in router.Do for that long.
type tracker struct {
	mu      sync.Mutex
	since   map[bucketmap.Bucket]time.Time
	windows []window
}

type window struct {
	bucket     bucketmap.Bucket
	start, end time.Time
}

func (t *tracker) observe(m *bucketmap.Map, now time.Time) {
	if m == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	moving := map[bucketmap.Bucket]bool{}
	for _, bk := range m.NonActive() {
		if m.MetaOf(bk).State == bucketmap.BucketMoving {
			moving[bk] = true
			if _, ok := t.since[bk]; !ok {
				t.since[bk] = now
			}
		}
	}
	for bk, s := range t.since {
		if !moving[bk] {
			t.windows = append(t.windows, window{bucket: bk, start: s, end: now})
			delete(t.since, bk)
		}
	}
}

// find returns the bucket's moving window that began after a move's start.
func (t *tracker) find(bucket bucketmap.Bucket, after time.Time) (window, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := len(t.windows) - 1; i >= 0; i-- {
		if w := t.windows[i]; w.bucket == bucket && !w.start.Before(after) {
			return w, true
		}
	}
	return window{}, false
}

// clientStalls sets each move's longest write to its bucket that started
// while the router's map said moving (or, not seen, between the fence and
// the teardown steps): those writes waited for the pause.
func (b *bench) clientStalls(moves []MoveRow, writes []kvload.Write) {
	for i := range moves {
		mr := &moves[i]
		lo, hi := mr.fenceAt, mr.teardownAt
		if w, ok := b.trk.find(bucketmap.Bucket{Prefix: mr.Bucket, Depth: mr.Level}, mr.startedAt); ok {
			lo, hi = w.start, w.end
		}
		if lo.IsZero() || hi.IsZero() {
			continue
		}
		loUS, hiUS := lo.Sub(b.start).Microseconds(), hi.Sub(b.start).Microseconds()
		for _, w := range writes {
			if w.Bucket == mr.Bucket && w.AtUS >= loUS && w.AtUS <= hiUS {
				mr.ClientMS = max(mr.ClientMS, float64(w.DurUS)/1000)
			}
		}
	}
}

// phaseLatencies sets the writes' latencies by phase, each write in one:
// the warm-up (until steadyFrom: the pools connect), steady (until
// steadyTo: no move), the rebalance (adding the node and every move,
// until rbTo; split into the writes that started in their bucket's
// moving window, which wait for the flip, and the others), and after
// (the rollbacks and the COPY baseline). write_latency_ms, the figure a
// comparison's goal bounds, is the rebalance's and after's: every write
// from the node's addition on, whatever --warmup and --steady are, as a
// slower rebalance holds more of them.
func (b *bench) phaseLatencies(sum *Summary, writes []kvload.Write, steadyFrom, steadyTo, rbTo time.Time) {
	us := func(t time.Time) int64 { return t.Sub(b.start).Microseconds() }
	fromUS, toUS, rbToUS := us(steadyFrom), us(steadyTo), us(rbTo)
	type span struct{ lo, hi int64 }
	inWindow := map[uint32][]span{}
	b.trk.mu.Lock()
	for _, w := range b.trk.windows {
		// The writes' buckets are at the load's level; a window of a bucket
		// split deeper covers part of one of them, shallower several.
		if d := int(w.bucket.Depth); d >= *load.Level {
			inWindow[w.bucket.Prefix>>(d-*load.Level)] = append(inWindow[w.bucket.Prefix>>(d-*load.Level)], span{us(w.start), us(w.end)})
		} else {
			for p := w.bucket.Prefix << (*load.Level - d); p < (w.bucket.Prefix+1)<<(*load.Level-d); p++ {
				inWindow[p] = append(inWindow[p], span{us(w.start), us(w.end)})
			}
		}
	}
	b.trk.mu.Unlock()
	moving := func(w kvload.Write) bool {
		for _, s := range inWindow[w.Bucket] {
			if w.AtUS >= s.lo && w.AtUS <= s.hi {
				return true
			}
		}
		return false
	}
	var warm, steady, all, rebalance, inMove, others, after []float64
	for _, w := range writes {
		ms := float64(w.DurUS) / 1000
		switch {
		case w.AtUS < fromUS:
			warm = append(warm, ms)
			continue
		case w.AtUS < toUS:
			steady = append(steady, ms)
			continue
		case w.AtUS <= rbToUS:
			rebalance = append(rebalance, ms)
			if moving(w) {
				inMove = append(inMove, ms)
			} else {
				others = append(others, ms)
			}
		default:
			after = append(after, ms)
		}
		all = append(all, ms)
	}
	for k, xs := range map[string][]float64{"write_latency_ms": all, "write_latency_warmup_ms": warm, "write_latency_steady_ms": steady,
		"write_latency_rebalance_ms": rebalance, "write_latency_moving_ms": inMove, "write_latency_not_moving_ms": others, "write_latency_after_ms": after} {
		sum.Stats[k] = benchkit.Of(xs)
	}
}
