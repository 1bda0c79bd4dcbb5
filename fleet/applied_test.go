package fleet

import (
	"errors"
	"testing"

	"github.com/shardvisor/shardvisor/topo"
)

// A member's applied version is its record's; a record that does not
// decode has none and says why.
func TestAppliedVersion(t *testing.T) {
	if v, err := AppliedVersion(topo.Entry[topo.RouterMember]{Rec: &topo.RouterMember{MapVersion: 7}}); v != 7 || err != nil {
		t.Fatalf("router: %d %v", v, err)
	}
	if v, err := AppliedVersion(topo.Entry[topo.PoolMember]{Rec: &topo.PoolMember{MapVersion: 9}}); v != 9 || err != nil {
		t.Fatalf("supervisor: %d %v", v, err)
	}
	bad := errors.New("malformed")
	if v, err := AppliedVersion(topo.Entry[topo.PoolMember]{Err: bad}); v != 0 || err != bad {
		t.Fatalf("unreadable: %d %v", v, err)
	}
}

// Members below a version, or unreadable, are stragglers; GC names three
// of them in listing order, the mover all of them.
func TestStragglers(t *testing.T) {
	members := []Applied{{Path: "/r/b", MapVersion: 5}, {Path: "/r/a", MapVersion: 3}, {Path: "/p/x", Err: errors.New("bad record")},
		{Path: "/p/y", MapVersion: 4}, {Path: "/p/z", MapVersion: 1}}
	if got := Stragglers(members, 1); len(got) != 1 || got[0].Member != "/p/x" {
		t.Fatalf("below 1: %+v", got)
	}
	ss := Stragglers(members, 5)
	if got, want := DescribeStragglers(ss), "/p/x (bad record), /p/y (map version 4), /p/z (map version 1), /r/a (map version 3)"; got != want {
		t.Fatalf("stragglers below 5: %q, want %q", got, want)
	}
	want := "4 members have not applied map version 5: /r/a (at map version 3), /p/x (record unreadable: bad record), /p/y (at map version 4) and 1 more"
	if got := DescribeBehind(members, 5); got != want {
		t.Fatalf("DescribeBehind: %q, want %q", got, want)
	}
	if got := DescribeBehind(members[:1], 5); got != "" {
		t.Fatalf("none behind: %q", got)
	}
}
