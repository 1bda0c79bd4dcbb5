package topo

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// A move's phases: where its time goes (MoveStats.Phases), in the order a
// move spends them. A state of MoveStates spans one or more phases; the
// write pause is PausePhases.
const (
	// PhasePrepare: the schemas compared, the target's range marked
	// incoming, leftovers cleared (state prepare).
	PhasePrepare = "prepare"
	// PhaseSetup: an earlier attempt's stream dropped, the range cleared
	// on the target, the publication and the disabled subscription made.
	PhaseSetup = "setup"
	// PhaseSlot: the forward slot created on the source, with the snapshot
	// the copy reads; it waits for the source's running transactions.
	PhaseSlot = "slot"
	// PhaseCopy: the rows copied from the slot's snapshot, and the
	// subscription enabled.
	PhaseCopy = "copy"
	// PhaseReverseSetup: the reverse stream made (publication, slot and
	// disabled subscription); its slot waits for the target's running
	// transactions.
	PhaseReverseSetup = "reverse_setup"
	// PhaseCatchup: lag probes (marker round trips) until one is under
	// --max-lag.
	PhaseCatchup = "catchup"
	// PhaseChecks: the target's foreign keys checked and the sequences
	// carried, before the pause.
	PhaseChecks = "checks"
	// PhaseMapMoving: the map's compare-and-swap that sets the bucket
	// moving.
	PhaseMapMoving = "map_moving"
	// PhaseMemberWait: routers and supervisors applying that map.
	PhaseMemberWait = "member_wait"
	// PhasePrepareOwn: the target's ownership prepared (not committed) on
	// a spare connection.
	PhasePrepareOwn = "prepare_own"

	// PhaseFreeze: the source's freeze, draining the writers in flight and
	// committing the barrier marker. The write pause starts here.
	PhaseFreeze = "freeze"
	// PhaseApply: the barrier marker applied on the target.
	PhaseApply = "apply"
	// PhaseSequences: the sequences carried inside the pause.
	PhaseSequences = "sequences"
	// PhaseSyncPoint: the target's synchronous standbys have what it
	// applied.
	PhaseSyncPoint = "sync_point"
	// PhaseSnapshot: the target's server identified again, and its
	// verification snapshot taken.
	PhaseSnapshot = "snapshot"
	// PhaseFlip: the ZooKeeper transaction that gives the bucket to the
	// target.
	PhaseFlip = "flip"
	// PhaseOwn: the target's prepared ownership committed. The write
	// pause ends here.
	PhaseOwn = "own"

	// PhaseRelease: both fences brought to the flip's version (the source
	// releases the range).
	PhaseRelease = "release"
	// PhaseTeardown: the forward stream dropped.
	PhaseTeardown = "teardown"
	// PhaseReverseStart: the reverse stream started.
	PhaseReverseStart = "reverse_start"
	// PhaseVerify: row counts and checksums compared.
	PhaseVerify = "verify"
	// PhaseComplete: the reverse stream dropped at the window's end.
	PhaseComplete = "complete"
	// PhaseRecord: ZooKeeper writes of the move record, whatever the step.
	PhaseRecord = "record"
)

// MovePhases lists every phase in the order a move spends them.
var MovePhases = []string{
	PhasePrepare, PhaseSetup, PhaseSlot, PhaseCopy, PhaseReverseSetup, PhaseCatchup, PhaseChecks,
	PhaseMapMoving, PhaseMemberWait, PhasePrepareOwn,
	PhaseFreeze, PhaseApply, PhaseSequences, PhaseSyncPoint, PhaseSnapshot, PhaseFlip, PhaseOwn,
	PhaseRelease, PhaseTeardown, PhaseReverseStart, PhaseVerify, PhaseComplete, PhaseRecord,
}

// PausePhases are the phases of the write pause, freeze to own.
var PausePhases = []string{PhaseFreeze, PhaseApply, PhaseSequences, PhaseSyncPoint, PhaseSnapshot, PhaseFlip, PhaseOwn}

// PhaseTime is the time a move spent in one phase, summed over its runs.
type PhaseTime struct {
	Phase string  `json:"phase"`
	MS    float64 `json:"ms"`
}

// ElapsedMS is a move's wall time in milliseconds: Stats.TotalMS once it
// ended, else from its creation to its record's last change.
func (r *MoveRecord) ElapsedMS() float64 {
	if r.Stats.TotalMS > 0 {
		return r.Stats.TotalMS
	}
	return float64(r.UpdatedAt.Sub(r.CreatedAt).Microseconds()) / 1000
}

// AddPhase adds d to phase's time, keeping MovePhases' order.
func (s *MoveStats) AddPhase(phase string, d time.Duration) {
	ms := float64(d.Microseconds()) / 1000
	for i := range s.Phases {
		if s.Phases[i].Phase == phase {
			s.Phases[i].MS += ms
			return
		}
	}
	s.Phases = append(s.Phases, PhaseTime{Phase: phase, MS: ms})
	rank := func(p string) int {
		if i := slices.Index(MovePhases, p); i >= 0 {
			return i
		}
		return len(MovePhases)
	}
	slices.SortStableFunc(s.Phases, func(a, b PhaseTime) int { return rank(a.Phase) - rank(b.Phase) })
}

// Phase is the time spent in phase (0 if none).
func (s *MoveStats) Phase(phase string) float64 {
	for _, p := range s.Phases {
		if p.Phase == phase {
			return p.MS
		}
	}
	return 0
}

// DescribePhases prints the phases that took at least min, in order:
// "slot 210 ms, copy 64 ms, ...". The pause's phases are left out when
// pause is false.
func (s *MoveStats) DescribePhases(min time.Duration, pause bool) string {
	var b strings.Builder
	for _, p := range s.Phases {
		if p.MS < float64(min.Microseconds())/1000 || (!pause && slices.Contains(PausePhases, p.Phase)) {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", p.Phase, fmtMS(p.MS))
	}
	return b.String()
}

// DescribePause prints the pause's phases of 0.1 ms or more: "freeze 2.1,
// apply 3.0, ... ms".
func (s *MoveStats) DescribePause() string {
	var parts []string
	for _, p := range s.Phases {
		if slices.Contains(PausePhases, p.Phase) && p.MS >= 0.05 {
			parts = append(parts, fmt.Sprintf("%s %.1f", p.Phase, p.MS))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, ", ") + " ms"
}

func fmtMS(ms float64) string {
	if ms < 10 {
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.0f ms", ms)
}
