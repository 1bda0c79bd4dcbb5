package fleet

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A vanished member counts at its last version for the grace after it was
// found gone, and not a moment longer; a record that never vanished is
// not one.
func TestVanished(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	grace := 10 * time.Second
	if _, ok := Vanished("/r/a", Seen{MapVersion: 4, LastSeen: t0}, t0.Add(time.Second), grace); ok {
		t.Fatal("a record that is there counted as vanished")
	}
	s := Seen{MapVersion: 4, LastSeen: t0, GoneAt: t0}
	a, ok := Vanished("/r/a", s, t0.Add(1200*time.Millisecond), grace)
	if !ok || a.Path != "/r/a" || a.MapVersion != 4 || a.Err != nil || a.Gone == nil {
		t.Fatalf("within the grace: %+v %v", a, ok)
	}
	if got, want := a.Gone.String(), "record vanished 1.2s ago; counted until its session is shown ended (at most 10s)"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
	if !a.Behind(5) || a.Behind(4) {
		t.Fatal("a vanished member is behind exactly the versions after its last one")
	}
	if _, ok := Vanished("/r/a", s, t0.Add(grace), grace); ok {
		t.Fatal("counted once the grace has passed")
	}
	// A polling reader found it gone later than it last saw it.
	a, _ = Vanished("/r/a", Seen{MapVersion: 4, LastSeen: t0, GoneAt: t0.Add(time.Minute)}, t0.Add(time.Minute+3*time.Millisecond), grace)
	if got, want := a.Gone.String(), "record vanished 3ms ago (last seen 1m0s ago); counted until its session is shown ended (at most 10s)"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
	members := []Applied{{Path: "/r/b", MapVersion: 6}, a}
	if got := DescribeStragglers(Stragglers(members, 5)); got != "/r/a (at map version 4, "+a.Gone.String()+")" {
		t.Fatalf("stragglers: %s", got)
	}
	if got := DescribeBehind(members, 5); !strings.Contains(got, "1 members have not applied map version 5: /r/a (at map version 4, record vanished 3ms ago") {
		t.Fatalf("DescribeBehind: %s", got)
	}
	if got := Stragglers(members, 4); len(got) != 0 {
		t.Fatalf("nobody behind 4: %+v", got)
	}
}

// Remembered: what one pass read counts; a member an earlier pass saw and
// this one misses counts at its last version from this pass on, for the
// grace; it counts anew, at its new version, when it is read again.
func TestRemembered(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	grace := 10 * time.Second
	var r Remembered
	paths := func(ms []Applied) string {
		var out []string
		for _, m := range ms {
			s := m.Path
			if m.Gone != nil {
				s += "(gone " + roundAgo(m.Gone.Ago).String() + ")"
			}
			out = append(out, s)
		}
		return strings.Join(out, " ")
	}
	bad := errors.New("not JSON")
	got := r.Pass([]Applied{{Path: "/r/a", MapVersion: 4}, {Path: "/r/b", MapVersion: 5}, {Path: "/r/c", Err: bad}}, t0, grace)
	if paths(got) != "/r/a /r/b /r/c" {
		t.Fatalf("first pass: %s", paths(got))
	}
	// a and c vanish; the pass that misses them starts their grace.
	got = r.Pass([]Applied{{Path: "/r/b", MapVersion: 5}}, t0.Add(time.Minute), grace)
	if paths(got) != "/r/b /r/a(gone 0s) /r/c(gone 0s)" || got[1].MapVersion != 4 || got[2].MapVersion != 0 || got[2].Err != nil {
		t.Fatalf("second pass: %s %+v", paths(got), got)
	}
	if !strings.Contains(got[1].Gone.String(), "last seen 1m0s ago") {
		t.Fatalf("the gap a poller cannot see into: %s", got[1].Gone)
	}
	// a is back at a new version; c is still gone, within the grace.
	got = r.Pass([]Applied{{Path: "/r/a", MapVersion: 7}, {Path: "/r/b", MapVersion: 5}}, t0.Add(time.Minute+4*time.Second), grace)
	if paths(got) != "/r/a /r/b /r/c(gone 4s)" || got[0].MapVersion != 7 || got[0].Gone != nil {
		t.Fatalf("third pass: %s %+v", paths(got), got)
	}
	// c's grace is over: forgotten, and not counted by later passes.
	for _, at := range []time.Duration{time.Minute + grace, 2 * time.Minute} {
		got = r.Pass([]Applied{{Path: "/r/a", MapVersion: 7}, {Path: "/r/b", MapVersion: 5}}, t0.Add(at), grace)
		if paths(got) != "/r/a /r/b" {
			t.Fatalf("after c's grace (%s): %s", at, paths(got))
		}
	}
	// a vanishes again: it counts at 7, its last version.
	got = r.Pass([]Applied{{Path: "/r/b", MapVersion: 5}}, t0.Add(3*time.Minute), grace)
	if paths(got) != "/r/b /r/a(gone 0s)" || got[1].MapVersion != 7 {
		t.Fatalf("a gone again: %s %+v", paths(got), got)
	}
}
