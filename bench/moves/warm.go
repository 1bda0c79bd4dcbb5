package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardvisor/shardvisor/zksession"
)

// warmZK sends ZooKeeper the kinds of request a move makes (a multi of a
// check and a set, as the flip; sets; reads) from warmers goroutines on s
// until d has passed, then deletes its node, and returns how many it sent.
// Each run starts its ensemble fresh, and a JVM compiles a request's path
// (with TLS, the records' too) under its first heavy traffic: without
// this, that traffic is the first moves', whose flips then measure the
// compiler. It runs beside the write load's warm-up, in both modes.
func warmZK(ctx context.Context, s *zksession.Session, p string, d time.Duration) (int64, error) {
	const warmers = 8
	if err := s.Create(ctx, p, nil); err != nil {
		return 0, fmt.Errorf("ZooKeeper warm-up: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, warmers)
	for w := range warmers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; wctx.Err() == nil; i++ {
				var err error
				switch i % 3 {
				case 0:
					_, st, gerr := s.Get(wctx, p)
					if err = gerr; err == nil {
						// A concurrent set may win: a failed check is a request served.
						if _, err = s.Multi(wctx, zksession.CheckOp(p, st.Version), zksession.SetOp(p, []byte("warm"), -1)); errors.Is(err, zksession.ErrBadVersion) {
							err = nil
						}
					}
				case 1:
					_, err = s.Set(wctx, p, []byte("warm"), -1)
				default:
					_, _, err = s.Children(wctx, p)
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
	derr := s.Delete(context.WithoutCancel(ctx), p, -1)
	if err := errors.Join(errors.Join(errs...), derr); err != nil {
		return n.Load(), fmt.Errorf("ZooKeeper warm-up: %w", err)
	}
	return n.Load(), nil
}
