package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// warmZK sends ZooKeeper writes (each a read and a versioned set, on a
// scratch node of its own per goroutine) and reads of the map from
// warmers goroutines on s until d has passed, then removes the scratch
// nodes, and returns how many requests it sent. Each run starts its
// ensemble fresh, and a JVM compiles a request's path (with TLS, the
// records' too) under its first heavy traffic: without this, that traffic
// is the first moves', whose flips then measure the compiler. It runs
// beside the write load's warm-up, in both modes.
func warmZK(ctx context.Context, s *zksession.Session, p topo.Paths, d time.Duration) (int64, error) {
	const warmers = 8
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, warmers)
	for w := range warmers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc, err := topo.CreateScratch(wctx, s, p, fmt.Sprintf("moves-bench-warm-%d", w), nil)
			if err != nil {
				errs[w] = err
				return
			}
			defer func() {
				if err := sc.Remove(context.WithoutCancel(ctx)); err != nil {
					errs[w] = errors.Join(errs[w], err)
				}
			}()
			for i := 0; wctx.Err() == nil; i++ {
				if i%2 == 0 {
					err = sc.Write(wctx, []byte("warm"))
				} else {
					_, _, err = topo.ReadMapData(wctx, s, p)
				}
				if err != nil {
					if wctx.Err() == nil {
						errs[w] = err
					}
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return n.Load(), fmt.Errorf("ZooKeeper warm-up: %w", err)
	}
	return n.Load(), nil
}
