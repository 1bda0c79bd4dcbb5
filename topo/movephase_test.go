package topo

import (
	"slices"
	"testing"
	"time"
)

// Phases add up per name and stay in MovePhases' order whatever order
// they were timed in; the descriptions leave out what is asked.
func TestMoveStatsPhases(t *testing.T) {
	var s MoveStats
	s.AddPhase(PhaseRecord, 3*time.Millisecond)
	s.AddPhase(PhaseFlip, 4*time.Millisecond)
	s.AddPhase(PhaseCopy, 20*time.Millisecond)
	s.AddPhase(PhaseRecord, 2*time.Millisecond)
	s.AddPhase(PhaseSequences, 0)
	s.AddPhase("later", time.Millisecond) // not a known phase: last
	var order []string
	for _, p := range s.Phases {
		order = append(order, p.Phase)
	}
	if want := []string{PhaseCopy, PhaseSequences, PhaseFlip, PhaseRecord, "later"}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	if s.Phase(PhaseRecord) != 5 || s.Phase(PhaseSlot) != 0 {
		t.Fatalf("record %v ms, slot %v ms", s.Phase(PhaseRecord), s.Phase(PhaseSlot))
	}
	if got := s.DescribePhases(4*time.Millisecond, false); got != "copy 20 ms, record 5.0 ms" {
		t.Fatalf("DescribePhases: %q", got)
	}
	if got := s.DescribePause(); got != "flip 4.0 ms" {
		t.Fatalf("DescribePause: %q", got)
	}
}
