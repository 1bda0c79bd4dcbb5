package main

import (
	"context"
	"testing"
	"time"
)

func TestPacerSpacesSlotsAndDoesNotCatchUp(t *testing.T) {
	p := newPacer(100) // 10 ms apart
	t0 := time.Unix(1000, 0)
	// Four clients ask at once: one slot each, 10 ms apart.
	for i := range 4 {
		if got, want := p.reserve(t0), t0.Add(time.Duration(i)*10*time.Millisecond); !got.Equal(want) {
			t.Fatalf("slot %d at %v, want %v", i, got, want)
		}
	}
	// After a stall of a second, the next slot is now, and the one after
	// it 10 ms later: the missed slots are not handed out in a burst.
	t1 := t0.Add(time.Second)
	if got := p.reserve(t1); !got.Equal(t1) {
		t.Fatalf("after a stall: slot at %v, want now (%v)", got, t1)
	}
	if got, want := p.reserve(t1), t1.Add(10*time.Millisecond); !got.Equal(want) {
		t.Fatalf("second slot after a stall at %v, want %v", got, want)
	}
}

func TestPacerWithoutRateNeverWaitsAndStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	if !newPacer(0).wait(ctx) {
		t.Fatal("no rate: wait returned false with a live context")
	}
	slow := newPacer(0.001) // one slot per 1000 s
	if !slow.wait(ctx) {
		t.Fatal("first slot is now: wait returned false")
	}
	cancel()
	if slow.wait(ctx) {
		t.Fatal("wait for a slot 1000 s away returned true after the context ended")
	}
}
