package benchkit

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Stopper runs a load's goroutines until Stop: C is closed once, and Stop
// waits for every goroutine started with Go.
type Stopper struct {
	C    chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// NewStopper returns a running Stopper.
func NewStopper() *Stopper { return &Stopper{C: make(chan struct{})} }

// Go runs f in a goroutine that Stop waits for.
func (s *Stopper) Go(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// Stop closes C (once) and waits for the goroutines.
func (s *Stopper) Stop() {
	s.once.Do(func() { close(s.C) })
	s.wg.Wait()
}

// Pacer paces one load goroutine at a fixed interval (0: as fast as it
// goes). After a stall of more than a second it starts again from now
// instead of catching up with a burst.
type Pacer struct {
	interval time.Duration
	next     time.Time
}

// NewPacer returns a Pacer whose first tick comes at a random point of the
// next interval. Writers started together with a fixed phase would fire
// in lockstep, a burst of all of them every interval: no fleet offers
// load like that, and a burst queues where a real load does not (at a
// pooler's single thread above all), so the spread is what makes a
// paced run an offered rate rather than a sequence of bursts.
func NewPacer(interval time.Duration) *Pacer {
	p := &Pacer{interval: interval, next: time.Now()}
	if interval > 0 {
		p.next = p.next.Add(rand.N(interval) - interval)
	}
	return p
}

// Wait waits for the next tick; false when stop closed first.
func (p *Pacer) Wait(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return false
	default:
	}
	if p.interval <= 0 {
		return true
	}
	p.next = p.next.Add(p.interval)
	if d := time.Until(p.next); d > 0 {
		select {
		case <-stop:
			return false
		case <-time.After(d):
		}
	} else if d < -time.Second {
		p.next = time.Now() // do not catch up after a stall
	}
	return true
}

// Sleep waits d, or until ctx is done (its error).
func Sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// IdempotencyKey is a random Idempotency-Key header value (16 bytes, hex).
func IdempotencyKey() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Context is a benchmark's context: cancelled by SIGINT or SIGTERM, so
// that the run stops, cleans up and reports what it has.
func Context() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// UserID names a benchmark's user i: "u00000042" (at least eight digits).
// The keystream routes by it, so every benchmark names its users alike;
// it is built without fmt, as the loads name millions of users.
func UserID(i uint32) string {
	var d [10]byte
	s := strconv.AppendUint(d[:0], uint64(i), 10)
	buf := make([]byte, 0, 1+max(8, len(s)))
	buf = append(buf, 'u')
	for range 8 - len(s) {
		buf = append(buf, '0')
	}
	return string(append(buf, s...))
}
