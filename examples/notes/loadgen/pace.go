package main

import (
	"context"
	"sync"
	"time"
)

// pacer spreads the clients' requests evenly over time: one slot every
// interval, handed out in turn. A client that finds every slot in the past
// (the app answers slower than the rate) gets the present one: no burst to
// catch up, so a stall is followed by the same rate, not a spike.
type pacer struct {
	interval time.Duration // 0: no limit
	mu       sync.Mutex
	next     time.Time
}

func newPacer(perSecond float64) *pacer {
	if perSecond <= 0 {
		return &pacer{}
	}
	return &pacer{interval: time.Duration(float64(time.Second) / perSecond)}
}

// reserve returns the start time of the caller's slot, given the time now.
func (p *pacer) reserve(now time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	slot := p.next
	if slot.Before(now) {
		slot = now
	}
	p.next = slot.Add(p.interval)
	return slot
}

// wait blocks until the caller's slot; false if ctx ended first.
func (p *pacer) wait(ctx context.Context) bool {
	if p.interval == 0 {
		return ctx.Err() == nil
	}
	d := time.Until(p.reserve(time.Now()))
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
