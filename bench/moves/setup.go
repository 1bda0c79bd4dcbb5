package main

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/keystream"
)

type loadRow struct {
	key int64
	idx uint32
}

// load fills every bucket with rowsPerBucket users "u%08d", COPYing each
// node's rows in key order straight into it (bypassing the fence, as
// replication and GC do). It returns the rows loaded and the first user
// index not generated.
func (b *bench) load(ctx context.Context) (int64, uint32, error) {
	m, _, err := b.st.Load(ctx)
	if err != nil {
		return 0, 0, err
	}
	nb, need := m.Buckets(), *rowsPerBucket
	total := nb * need
	counts := make([]int, nb)
	perNode := make([][]loadRow, startNodes)
	for i := range perNode {
		perNode[i] = make([]loadRow, 0, total/startNodes+need)
	}
	say("generating %s users for %d buckets x %d rows", human(float64(total)), nb, need)
	const chunk = 1 << 18
	prefixes := make([]uint64, chunk)
	left, idx := total, uint32(0)
	procs := runtime.GOMAXPROCS(0)
	for left > 0 {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		var wg sync.WaitGroup
		per := (chunk + procs - 1) / procs
		for p := range procs {
			wg.Go(func() {
				for j := p * per; j < min(chunk, (p+1)*per); j++ {
					prefixes[j] = b.ks.Prefix64(benchkit.UserID(idx + uint32(j)))
				}
			})
		}
		wg.Wait()
		for j := 0; j < chunk && left > 0; j++ {
			bk := keystream.BucketOf(prefixes[j], *load.Level)
			if counts[bk] >= need {
				continue
			}
			counts[bk]++
			left--
			o := m.OwnerIndex(bk) // the map is at the load's level: slot = bucket
			perNode[o] = append(perNode[o], loadRow{key: keystream.Key(prefixes[j]), idx: idx + uint32(j)})
		}
		idx += chunk
	}
	for i := range perNode {
		slices.SortFunc(perNode[i], func(x, y loadRow) int { return cmp.Compare(x.key, y.key) })
	}
	var done atomic.Int64
	start := time.Now()
	progress := benchkit.NewStopper()
	progress.Go(func() {
		for pace := benchkit.NewPacer(5 * time.Second); pace.Wait(progress.C); {
			n := done.Load()
			say("  loading: %s / %s rows (%s rows/s)", human(float64(n)), human(float64(total)), human(float64(n)/time.Since(start).Seconds()))
		}
	})
	err = clustertest.EachNode(ctx, b.nodes[:startNodes], func(i int, _ bucketmap.Node, c *pgx.Conn) error {
		rows := pgx.CopyFromSlice(len(perNode[i]), func(j int) ([]any, error) {
			done.Add(1)
			return []any{perNode[i][j].key, benchkit.UserID(perNode[i][j].idx), int64(0)}, nil
		})
		got, err := clustertest.CopyAsReplica(ctx, c, pgx.Identifier{"app", "kv"}, []string{"bkey", "uid", "v"}, rows)
		if err == nil && got != int64(len(perNode[i])) {
			err = fmt.Errorf("copied %d rows of %d", got, len(perNode[i]))
		}
		return err
	})
	progress.Stop()
	if err != nil {
		return 0, 0, fmt.Errorf("loading: %w", err)
	}
	say("  loaded %s rows in %.1f s (%s rows/s); VACUUM ANALYZE", human(float64(done.Load())), time.Since(start).Seconds(), human(float64(done.Load())/time.Since(start).Seconds()))
	if err := clustertest.EachNode(ctx, b.nodes[:startNodes], func(_ int, _ bucketmap.Node, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "VACUUM (ANALYZE) app.kv")
		return err
	}); err != nil {
		return 0, 0, err
	}
	return done.Load(), idx, nil
}
