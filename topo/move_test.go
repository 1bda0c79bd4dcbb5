package topo

import (
	"slices"
	"testing"
)

// legalMoveEdges are the move transitions the mover takes, written out
// apart from MoveTransitions so that a change to the table shows here.
var legalMoveEdges = []string{
	"prepare>copy", "prepare>fence", "prepare>aborting",
	"copy>catchup", "copy>aborting",
	"catchup>fence", "catchup>aborting",
	"fence>barrier", "fence>flip", "fence>aborting",
	"barrier>flip", "barrier>aborting",
	"flip>teardown", "flip>done", "flip>aborting",
	"teardown>reverse", "teardown>verify",
	"reverse>verify",
	"verify>reversible", "verify>done", "verify>failed",
	"reversible>completing", "reversible>rolled_back", "reversible>done", "reversible>failed",
	"completing>done",
	"aborting>aborted",
	"failed>aborted",
}

// TestMoveTransitionsWholeTable checks every pair of states: each legal
// edge is accepted, every other pair refused with a *MoveTransitionError
// naming both states.
func TestMoveTransitionsWholeTable(t *testing.T) {
	if len(MoveStates) != 16 {
		t.Fatalf("%d move states, want 16: %v", len(MoveStates), MoveStates)
	}
	for from := range MoveTransitions {
		if !slices.Contains(MoveStates, from) {
			t.Errorf("MoveTransitions has unknown state %q", from)
		}
	}
	accepted := 0
	for _, from := range MoveStates {
		for _, to := range MoveStates {
			err := CheckMoveTransition(from, to)
			legal := slices.Contains(legalMoveEdges, from+">"+to)
			switch {
			case legal && err != nil:
				t.Errorf("%s -> %s refused: %v", from, to, err)
			case legal:
				accepted++
			case err == nil:
				t.Errorf("%s -> %s accepted; it is not a legal edge", from, to)
			default:
				te, ok := err.(*MoveTransitionError)
				if !ok || te.From != from || te.To != to {
					t.Errorf("%s -> %s: error %#v, want a *MoveTransitionError naming both", from, to, err)
				}
			}
		}
	}
	if accepted != len(legalMoveEdges) {
		t.Errorf("%d edges accepted, want %d", accepted, len(legalMoveEdges))
	}
	for _, to := range MoveStates {
		if CheckMoveTransition("", to) == nil || CheckMoveTransition("bogus", to) == nil {
			t.Errorf("a transition to %s from no state or an unknown one is accepted", to)
		}
	}
}

// TestMoveTransitionsShape: every state is reached from a start state, and
// every state that is not final reaches a final one.
func TestMoveTransitionsShape(t *testing.T) {
	reached := map[string]bool{}
	var visit func(string)
	visit = func(s string) {
		if reached[s] {
			return
		}
		reached[s] = true
		for _, n := range MoveTransitions[s] {
			visit(n)
		}
	}
	for _, s := range MoveStarts {
		visit(s)
	}
	final := map[string]bool{MoveDone: true, MoveAborted: true, MoveRolledBack: true}
	for _, s := range MoveStates {
		if !reached[s] {
			t.Errorf("state %s is reached from no start state", s)
		}
		if final[s] != (len(MoveTransitions[s]) == 0) {
			t.Errorf("state %s: final %v, but has next states %v", s, final[s], MoveTransitions[s])
		}
		if (&MoveRecord{State: s}).Finished() != final[s] {
			t.Errorf("state %s: MoveRecord.Finished disagrees with the table", s)
		}
	}
}
