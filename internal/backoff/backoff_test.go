package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDelayDoublesAndCaps(t *testing.T) {
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for n, w := range want {
		if got := Delay(100, 1000, n); got != w {
			t.Errorf("Delay(100, 1000, %d) = %d, want %d", n, got, w)
		}
	}
	if got := Delay(0, time.Second, 3); got != 0 {
		t.Errorf("Delay with no initial = %v, want 0", got)
	}
	// A huge n never overflows: doubling stops at Max.
	if got := Delay(time.Millisecond, time.Second, 1<<20); got != time.Second {
		t.Errorf("Delay(n=2^20) = %v, want the cap", got)
	}
}

func TestJitterStaysInBoundsAndVaries(t *testing.T) {
	b := New(100*time.Millisecond, time.Second)
	seen := map[time.Duration]bool{}
	for i := 0; i < 200; i++ {
		b.Reset()
		d := b.Next()
		if d < 80*time.Millisecond || d > 120*time.Millisecond {
			t.Fatalf("first delay %v outside 100ms ±20%%", d)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Fatalf("only %d distinct delays in 200 draws: no jitter", len(seen))
	}
	b.Reset()
	for i := 0; i < 10; i++ {
		b.Next()
	}
	if d := b.Next(); d < 800*time.Millisecond || d > 1200*time.Millisecond {
		t.Fatalf("capped delay %v outside 1s ±20%%", d)
	}
	if b.Attempts() != 11 {
		t.Fatalf("Attempts = %d, want 11", b.Attempts())
	}
}

func TestWaitReturnsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := New(time.Hour, time.Hour)
	if err := b.Wait(ctx); err != context.Canceled {
		t.Fatalf("Wait on a cancelled context = %v, want context.Canceled", err)
	}
}
