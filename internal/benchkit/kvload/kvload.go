// Package kvload is the write load the moves and schema benchmarks put on
// app.kv (clustertest.KV) through router.Do: writers that each own their
// users upsert them, updating users the benchmark loaded
// (benchkit.UserID) or inserting new ones, and record every write and
// every acknowledged value, so that a benchmark can time the writes and
// check the acknowledged ones on their owners afterwards.
package kvload

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/router"
)

// Options is a load.
type Options struct {
	Router    *router.Router
	Keystream *keystream.Keystream
	// Level is the map level a write's bucket is recorded at.
	Level   int
	Writers int
	// Rate is the total writes/s offered (0: as fast as the writers go).
	Rate int
	// InsertFrac of the writes insert a new user (Fresh + writer-number);
	// the others update one of the Users loaded users, writer w owning
	// those whose index is w modulo Writers.
	InsertFrac float64
	Users      int
	Fresh      string
	// Seed seeds the writers' random sources (with their number).
	Seed uint64
	// Start is the time Write.AtUS counts from (default: the load's
	// start, Load.Started).
	Start time.Time
}

// Write is one write: its start (µs since Options.Start), its duration
// with router.Do's retries, its bucket and whether it was acknowledged.
type Write struct {
	AtUS   int64
	DurUS  int32
	Bucket uint32
	OK     bool
}

// Result is what the writers recorded.
type Result struct {
	// Acked is every user's last acknowledged value.
	Acked map[string]int64
	// Uncertain holds, per user, the values of the failed writes after
	// its last acknowledged one: they may have committed.
	Uncertain map[string][]int64
	Writes    []Write
}

// Load runs until Stop.
type Load struct {
	Started              time.Time
	Acks, Failed, GaveUp atomic.Int64
	LastErr              atomic.Pointer[string]
	stop                 *benchkit.Stopper
	res                  []*Result
}

// Start starts the writers.
func Start(o Options) *Load {
	nw := o.Writers
	l := &Load{stop: benchkit.NewStopper(), Started: time.Now(), res: make([]*Result, nw)}
	if o.Start.IsZero() {
		o.Start = l.Started
	}
	var interval time.Duration
	if o.Rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(nw) / float64(o.Rate))
	}
	usersPer := max(o.Users/nw, 1)
	for w := range nw {
		res := &Result{Acked: map[string]int64{}, Uncertain: map[string][]int64{}}
		l.res[w] = res
		l.stop.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), o.Seed))
			var seq, fresh int64
			pace := benchkit.NewPacer(interval)
			for pace.Wait(l.stop.C) {
				var uid string
				if rng.Float64() < o.InsertFrac {
					fresh++
					uid = fmt.Sprintf("%s%02d-%d", o.Fresh, w, fresh)
				} else {
					uid = benchkit.UserID(uint32(rng.IntN(usersPer)*nw + w))
				}
				seq++
				v := seq
				prefix := o.Keystream.Prefix64(uid)
				key := keystream.Key(prefix)
				wctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				start := time.Now()
				err := o.Router.Do(wctx, uid, func(ctx context.Context, pool *pgxpool.Pool, _ router.Route) error {
					_, err := pool.Exec(ctx, clustertest.KVUpsert, key, uid, v)
					return err
				})
				dur := time.Since(start)
				cancel()
				res.Writes = append(res.Writes, Write{AtUS: start.Sub(o.Start).Microseconds(), DurUS: int32(min(dur.Microseconds(), math.MaxInt32)),
					Bucket: keystream.BucketOf(prefix, o.Level), OK: err == nil})
				if err != nil {
					l.Failed.Add(1)
					if strings.Contains(err.Error(), "gave up") {
						l.GaveUp.Add(1)
					}
					msg := err.Error()
					l.LastErr.Store(&msg)
					res.Uncertain[uid] = append(res.Uncertain[uid], v)
					continue
				}
				l.Acks.Add(1)
				res.Acked[uid] = v
				delete(res.Uncertain, uid)
			}
		})
	}
	return l
}

// Stop stops the writers and waits for them.
func (l *Load) Stop() { l.stop.Stop() }

// Result merges the writers' records (after Stop). Writers own disjoint
// users, so the maps do not overlap.
func (l *Load) Result() *Result {
	all := &Result{Acked: map[string]int64{}, Uncertain: map[string][]int64{}}
	for _, r := range l.res {
		for k, v := range r.Acked {
			all.Acked[k] = v
		}
		for k, v := range r.Uncertain {
			all.Uncertain[k] = v
		}
		all.Writes = append(all.Writes, r.Writes...)
	}
	return all
}
