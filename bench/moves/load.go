package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/router"
)

type write struct {
	atUS   int64 // start, µs since the bench started
	durUS  int32
	bucket uint32
	ok     bool
}

type writerResult struct {
	acked     map[string]int64
	uncertain map[string][]int64 // values of failed writes after the last acknowledged one
	writes    []write
}

type load struct {
	stop    *benchkit.Stopper
	started time.Time
	acks    atomic.Int64
	failed  atomic.Int64
	gaveUp  atomic.Int64
	lastErr atomic.Pointer[string]
	res     []*writerResult
}

func (b *bench) startLoad(maxIdx uint32) *load {
	l := &load{stop: benchkit.NewStopper(), started: time.Now(), res: make([]*writerResult, *writers)}
	nw := *writers
	var interval time.Duration
	if *rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(nw) / float64(*rate))
	}
	usersPer := int(maxIdx) / nw
	for w := range nw {
		res := &writerResult{acked: map[string]int64{}, uncertain: map[string][]int64{}}
		l.res[w] = res
		l.stop.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var seq, fresh int64
			pace := benchkit.NewPacer(interval)
			for pace.Wait(l.stop.C) {
				var uid string
				if rng.Float64() < *insertFrac {
					fresh++
					uid = fmt.Sprintf("n%02d-%d", w, fresh)
				} else {
					uid = benchkit.UserID(uint32(rng.IntN(usersPer)*nw + w))
				}
				seq++
				v := seq
				prefix := b.ks.Prefix64(uid)
				key := keystream.Key(prefix)
				wctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				start := time.Now()
				err := b.r.Do(wctx, uid, func(ctx context.Context, pool *pgxpool.Pool, _ router.Route) error {
					_, err := pool.Exec(ctx, `INSERT INTO app.kv (bkey, uid, v) VALUES ($1, $2, $3) ON CONFLICT (bkey, uid) DO UPDATE SET v = EXCLUDED.v`, key, uid, v)
					return err
				})
				dur := time.Since(start)
				cancel()
				res.writes = append(res.writes, write{atUS: start.Sub(b.start).Microseconds(), durUS: int32(min(dur.Microseconds(), math.MaxInt32)),
					bucket: keystream.BucketOf(prefix, *level), ok: err == nil})
				if err != nil {
					l.failed.Add(1)
					if strings.Contains(err.Error(), "gave up") {
						l.gaveUp.Add(1)
					}
					msg := err.Error()
					l.lastErr.Store(&msg)
					res.uncertain[uid] = append(res.uncertain[uid], v)
					continue
				}
				l.acks.Add(1)
				res.acked[uid] = v
				delete(res.uncertain, uid)
			}
		})
	}
	return l
}

func (l *load) finish() { l.stop.Stop() }

// result merges the writers' records (after finish). Writers own disjoint
// users, so the maps do not overlap.
func (l *load) result() *writerResult {
	all := &writerResult{acked: map[string]int64{}, uncertain: map[string][]int64{}}
	for _, r := range l.res {
		for k, v := range r.acked {
			all.acked[k] = v
		}
		for k, v := range r.uncertain {
			all.uncertain[k] = v
		}
		all.writes = append(all.writes, r.writes...)
	}
	return all
}

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

func (t *tracker) pause(bucket bucketmap.Bucket, after time.Time) (time.Duration, bool) {
	w, ok := t.find(bucket, after)
	return w.end.Sub(w.start), ok
}

// clientStalls sets each move's longest write to its bucket that started
// while the router's map said moving (or, not seen, between the fence and
// the teardown steps): those writes waited for the pause.
func (b *bench) clientStalls(moves []MoveRow, writes []write) {
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
			if w.bucket == mr.Bucket && w.atUS >= loUS && w.atUS <= hiUS {
				mr.ClientMS = max(mr.ClientMS, float64(w.durUS)/1000)
			}
		}
	}
}
