// Package backoff is the one retry delay of the project: exponential,
// capped, with jitter, so that a fleet of processes that failed together
// does not retry together (docs/architecture.md, "Bounded everything").
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff yields growing delays: Initial, then doubling up to Max, each
// drawn at random from [d·(1-Jitter), d·(1+Jitter)] so that processes that
// failed together spread out. The zero value is not useful; see New.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
	// Jitter is the fraction of each delay that is random, 0 to 1
	// (0.2 means ±20%).
	Jitter float64

	n int
}

// New returns a backoff from initial up to max with ±20% jitter.
func New(initial, max time.Duration) *Backoff {
	return &Backoff{Initial: initial, Max: max, Jitter: 0.2}
}

// Delay is the n-th delay (n from 0), without jitter: Initial·2^n capped
// at Max. Pure, for callers that keep their own count.
func Delay(initial, max time.Duration, n int) time.Duration {
	if initial <= 0 {
		return 0
	}
	d := initial
	for i := 0; i < n && d < max; i++ {
		d *= 2
	}
	if max > 0 && d > max {
		d = max
	}
	return d
}

// Jittered spreads d over [d·(1-j), d·(1+j)].
func Jittered(d time.Duration, j float64) time.Duration {
	if d <= 0 || j <= 0 {
		return d
	}
	if j > 1 {
		j = 1
	}
	span := int64(float64(d) * j)
	if span <= 0 {
		return d
	}
	return d - time.Duration(span) + time.Duration(rand.Int64N(2*span+1))
}

// Next returns the next delay and advances.
func (b *Backoff) Next() time.Duration {
	d := Jittered(Delay(b.Initial, b.Max, b.n), b.Jitter)
	b.n++
	return d
}

// Attempts is how many delays Next has returned since the last Reset.
func (b *Backoff) Attempts() int { return b.n }

// Reset starts again from Initial, after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Wait sleeps for the next delay, or returns ctx's error if it ends first.
func (b *Backoff) Wait(ctx context.Context) error { return Sleep(ctx, b.Next()) }

// Sleep waits for d, or returns ctx's error if it ends first.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
