package gc

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

// parseMove reads move records through topo.MoveRecord: only done and
// aborted are final, a state the movers write blocks its bucket's key
// range only, and anything GC cannot be sure of blocks every key.
func TestParseMove(t *testing.T) {
	rec := func(state string) []byte {
		data, err := json.Marshal(topo.MoveRecord{Version: topo.MoveVersion, ID: "mv", Bucket: 5, Level: 3, State: state, Source: "n1", Target: "n2"})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	lo5, hi5, _ := keystream.Range(3, 5)
	allLo, allHi := keystream.Key(0), keystream.Key(^uint64(0))

	// Final: not in flight.
	for _, st := range []string{topo.MoveDone, topo.MoveAborted} {
		if mr, inFlight := parseMove("/m/mv", "mv", rec(st)); inFlight {
			t.Errorf("state %s: in flight %+v, want final", st, mr)
		}
	}
	// In flight, over the bucket's range only (failed included: its
	// source rows stay).
	for _, st := range []string{topo.MovePrepare, topo.MoveCopy, topo.MoveCatchup, topo.MoveFence, topo.MoveBarrier,
		topo.MoveFlip, topo.MoveTeardown, topo.MoveVerify, topo.MoveAborting, topo.MoveFailed} {
		mr, inFlight := parseMove("/m/mv", "mv", rec(st))
		if !inFlight || mr.All || mr.Lo != lo5 || mr.Hi != hi5 || mr.Bucket != 5 || mr.Level != 3 {
			t.Errorf("state %s: %+v in flight %v, want bucket 5's range [%d, %d]", st, mr, inFlight, lo5, hi5)
		}
	}
	// Everything: states nobody writes (including the "finished" and
	// "cancelled" GC once counted as final), and records that do not
	// decode strictly.
	blockAll := map[string][]byte{
		"unknown state":     rec("copying"),
		"finished":          rec("finished"),
		"cancelled":         rec("cancelled"),
		"empty state":       rec(""),
		"garbage":           []byte("garbage"),
		"empty":             nil,
		"no version":        []byte(`{"bucket":5,"level":3,"state":"done"}`),
		"newer version":     []byte(`{"version":99,"bucket":5,"level":3,"state":"done"}`),
		"unknown field":     []byte(`{"version":1,"bucket":5,"level":3,"state":"done","later":true}`),
		"negative bucket":   []byte(`{"version":1,"bucket":-1,"level":3,"state":"copy"}`),
		"bucket past level": []byte(`{"version":1,"bucket":8,"level":3,"state":"copy"}`),
		"bad level":         []byte(`{"version":1,"bucket":0,"level":99,"state":"copy"}`),
		"trailing data":     []byte(`{"version":1,"bucket":5,"level":3,"state":"done"} {}`),
		// Read as 0 by the strict decoder: bucket 0 would be a guess.
		"no bucket":   []byte(`{"version":1,"level":3,"state":"copy"}`),
		"null bucket": []byte(`{"version":1,"bucket":null,"level":3,"state":"copy"}`),
		"no level":    []byte(`{"version":1,"bucket":5,"state":"copy"}`),
	}
	for name, data := range blockAll {
		mr, inFlight := parseMove("/m/mv", "mv", data)
		if !inFlight || !mr.All || mr.Lo != allLo || mr.Hi != allHi || !strings.Contains(mr.Why, "mv") {
			t.Errorf("%s: %+v in flight %v, want a move of every key", name, mr, inFlight)
		}
	}
}

// The one definition of the move states: every state is known, and only
// done, aborted and rolled_back are final (reversible is not: GC keeps the
// old owner's rows through the rollback window).
func TestMoveStates(t *testing.T) {
	final := map[string]bool{topo.MoveDone: true, topo.MoveAborted: true, topo.MoveRolledBack: true}
	for _, st := range []string{topo.MovePrepare, topo.MoveCopy, topo.MoveCatchup, topo.MoveFence, topo.MoveBarrier,
		topo.MoveFlip, topo.MoveTeardown, topo.MoveReverse, topo.MoveVerify, topo.MoveReversible, topo.MoveCompleting,
		topo.MoveDone, topo.MoveAborting, topo.MoveAborted, topo.MoveRolledBack, topo.MoveFailed} {
		if !topo.MoveStateKnown(st) || topo.MoveStateFinal(st) != final[st] {
			t.Errorf("state %s: known %v final %v", st, topo.MoveStateKnown(st), topo.MoveStateFinal(st))
		}
	}
	for _, st := range []string{"", "finished", "cancelled", "copying"} {
		if topo.MoveStateKnown(st) || topo.MoveStateFinal(st) {
			t.Errorf("state %q counted as known or final", st)
		}
	}
}
