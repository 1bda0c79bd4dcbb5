package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardvisor/shardvisor/internal/testkit"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// applied is watcher w's OnUpdate for map version v.
type applied struct {
	w  int
	v  uint64
	at time.Time
}

type watcher struct {
	sess *zksession.Session
	r    *router.Router
	read atomic.Int64 // every byte the servers sent this watcher
}

type fleet struct {
	ws  []*watcher
	evs chan applied
}

func (f *fleet) wire() (n int64) {
	for _, w := range f.ws {
		n += w.read.Load()
	}
	return n
}

// startFleet opens the sessions and the routers and waits until every
// router has the map.
func startFleet(ctx context.Context, p topo.Paths) (_ *fleet, err error) {
	f := &fleet{evs: make(chan applied, 4**watchers)}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	for range *watchers {
		w := &watcher{}
		if w.sess, err = zksession.Open(zksession.Config{Connect: *zkConnect, Dial: testkit.CountingDial(&w.read)}); err != nil {
			return nil, err
		}
		f.ws = append(f.ws, w)
	}
	if err = f.each(ctx, "session", func(ctx context.Context, w *watcher) error { return w.sess.WaitConnected(ctx) }); err != nil {
		return nil, err
	}
	for i, w := range f.ws {
		// Keep 2: 16 snapshots of a 2^16 map times 100 routers would be ~600 MB.
		// Member records as sidecars register them, updated on every change.
		w.r = router.New(w.sess, p, router.Options{Keep: 2, MemberID: fmt.Sprintf("w%03d", i)})
		w.r.OnUpdate(func(v uint64) { f.evs <- applied{w: i, v: v, at: time.Now()} })
	}
	if err = f.each(ctx, "router", func(ctx context.Context, w *watcher) error { return w.r.WaitReady(ctx) }); err != nil {
		return nil, err
	}
	return f, nil
}

// each runs wait on every watcher in turn, a minute each at the most.
func (f *fleet) each(ctx context.Context, what string, wait func(context.Context, *watcher) error) error {
	for _, w := range f.ws {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := wait(wctx, w)
		cancel()
		if err != nil {
			return fmt.Errorf("watcher %s: %w", what, err)
		}
	}
	return nil
}

func (f *fleet) close() {
	var wg sync.WaitGroup
	for _, w := range f.ws {
		wg.Go(func() {
			if w.r != nil {
				w.r.Close()
			}
			w.sess.Close()
		})
	}
	wg.Wait()
}

// await collects every watcher's OnUpdate for version v.
func (f *fleet) await(ctx context.Context, v uint64) (map[int]time.Time, error) {
	got := map[int]time.Time{}
	t := time.NewTimer(*timeout)
	defer t.Stop()
	for len(got) < len(f.ws) {
		select {
		case ev := <-f.evs:
			if ev.v == v {
				got[ev.w] = ev.at
			}
		case <-t.C:
			return got, fmt.Errorf("after %s only %d of %d watchers applied map version %d", *timeout, len(got), len(f.ws), v)
		case <-ctx.Done():
			return got, ctx.Err()
		}
	}
	return got, nil
}
