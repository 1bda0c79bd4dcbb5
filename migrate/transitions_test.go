package migrate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sync"
	"testing"

	"github.com/shardvisor/shardvisor/topo"
)

// refusals are the transitions the mover refused during this test run,
// but for those a test asked for (expectRefusal).
var refusals struct {
	sync.Mutex
	expected map[string]bool
	seen     []string
}

func expectRefusal(move string) {
	refusals.Lock()
	defer refusals.Unlock()
	if refusals.expected == nil {
		refusals.expected = map[string]bool{}
	}
	refusals.expected[move] = true
}

// TestMain fails the run if any move driven by the package's tests (the
// memory-ZooKeeper decision tests, and with servers every integration
// test) took a transition topo.MoveTransitions does not allow.
func TestMain(m *testing.M) {
	refusedTransition = func(move string, err error) {
		refusals.Lock()
		defer refusals.Unlock()
		if !refusals.expected[move] {
			refusals.seen = append(refusals.seen, err.Error())
		}
	}
	code := m.Run()
	if len(refusals.seen) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the mover took transitions topo.MoveTransitions does not allow:\n")
		for _, s := range refusals.seen {
			fmt.Fprintf(os.Stderr, "\t%s\n", s)
		}
		code = 1
	}
	os.Exit(code)
}

// TestEnterRefusesIllegalTransitions: enter and step refuse a change the
// table does not allow, with a typed error and the record untouched
// (nothing is saved: the run has no session to save with).
func TestEnterRefusesIllegalTransitions(t *testing.T) {
	for _, tc := range []struct{ from, to string }{
		{topo.MoveDone, topo.MovePrepare},
		{topo.MoveTeardown, topo.MoveAborting},
		{topo.MoveCopy, topo.MoveFlip},
		{topo.MoveAborted, topo.MoveAborting},
	} {
		id := "illegal-" + tc.from + "-" + tc.to
		expectRefusal(id)
		r := &run{mv: &Mover{}, rec: &topo.MoveRecord{ID: id, State: tc.from}}
		for name, err := range map[string]error{"enter": r.enter(context.Background(), tc.to), "step": r.step(tc.to)} {
			var te *topo.MoveTransitionError
			if !errors.As(err, &te) || te.From != tc.from || te.To != tc.to {
				t.Errorf("%s %s -> %s: %v, want a *topo.MoveTransitionError", name, tc.from, tc.to, err)
			}
		}
		if r.rec.State != tc.from || len(r.rec.Steps) != 0 {
			t.Errorf("%s -> %s refused, yet the record changed: %s, %v", tc.from, tc.to, r.rec.State, r.rec.Steps)
		}
	}
}

// TestDocListsEveryState: the package doc lists the move states as topo
// defines them.
func TestDocListsEveryState(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, m := range regexp.MustCompile(`(?m)^//\t([a-z_]+) `).FindAllSubmatch(b, -1) {
		listed = append(listed, string(m[1]))
	}
	if !slices.Equal(listed, topo.MoveStates) {
		t.Errorf("doc.go lists %v, topo.MoveStates are %v", listed, topo.MoveStates)
	}
}
