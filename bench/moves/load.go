package main

import (
	"sync"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
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
