// Package fleet is what the cluster's members (routers, and the supervisors
// of every pool) have applied, built on their member records in topo: the
// applied map version of each member, read in one place (AppliedVersion),
// the stragglers below a map version, a watched view of the members that
// the mover waits on (WatchMembers), and the fleet status the router's
// status page shows (Status: members, fail-static episodes, pools, moves).
//
// topo owns the paths and record formats; fleet only reads them.
package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Member kinds.
const (
	KindRouter     = "router"
	KindSupervisor = "supervisor"
)

// record is a member record: a router's or a supervisor's.
type record interface {
	topo.RouterMember | topo.PoolMember
}

// AppliedVersion is the map version a member has applied, as its record
// says; the error is the record's, when it does not decode (the member
// then counts as behind every version). It is the one reading of this
// fact: the mover's wait, GC and the fleet status all ask it.
func AppliedVersion[R record](e topo.Entry[R]) (uint64, error) {
	if e.Err != nil {
		return 0, e.Err
	}
	switch rec := any(e.Rec).(type) {
	case *topo.RouterMember:
		return rec.MapVersion, nil
	case *topo.PoolMember:
		return rec.MapVersion, nil
	}
	return 0, nil
}

// Applied is one member's applied map version, from its record.
type Applied struct {
	Path       string
	MapVersion uint64
	Err        error // the record does not decode
	// Gone, if set: the record was seen and has vanished since; the
	// member counts at MapVersion, its record's last (see Vanished).
	Gone *Gone
}

// Behind says whether the member is not known to have applied map
// version v: it is at a lower one, or its record does not decode.
func (m Applied) Behind(v uint64) bool { return m.Err != nil || m.MapVersion < v }

func applied[R record](e topo.Entry[R]) Applied {
	v, err := AppliedVersion(e)
	return Applied{Path: e.Path, MapVersion: v, Err: err}
}

// ReadApplied reads every live member record (routers, and every pool's
// supervisors) once. A member still routing by a map from before a range
// changed owner may read the range on its old owner; a move no longer
// waits for such stragglers (docs/moves.md, "Stragglers"), so GC does.
// One read cannot see a record that vanished; a reader that reads again
// keeps them with Remembered.
func ReadApplied(ctx context.Context, s *zksession.Session, p topo.Paths) ([]Applied, error) {
	var out []Applied
	routers, err := topo.ListRouters(ctx, s, p)
	if err != nil {
		return nil, err
	}
	for _, e := range routers {
		out = append(out, applied(e))
	}
	pools, err := topo.ListPools(ctx, s, p)
	if err != nil {
		return nil, err
	}
	for _, pool := range pools {
		entries, err := topo.ListPoolMembers(ctx, s, p, pool)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			out = append(out, applied(e))
		}
	}
	return out, nil
}

// Stragglers lists, sorted by path, the members that have not applied map
// version v: at a lower version (MapVersion says which), with a record
// that does not decode (Error says why), or with a record that vanished
// at a lower version (MapVersion, and Error says since when).
func Stragglers(members []Applied, v uint64) []topo.Straggler {
	var out []topo.Straggler
	for _, m := range members {
		switch {
		case m.Err != nil:
			out = append(out, topo.Straggler{Member: m.Path, Error: m.Err.Error()})
		case m.MapVersion < v && m.Gone != nil:
			out = append(out, topo.Straggler{Member: m.Path, MapVersion: m.MapVersion, Error: fmt.Sprintf("at map version %d, %s", m.MapVersion, m.Gone)})
		case m.MapVersion < v:
			out = append(out, topo.Straggler{Member: m.Path, MapVersion: m.MapVersion})
		}
	}
	slices.SortStableFunc(out, func(a, b topo.Straggler) int { return strings.Compare(a.Member, b.Member) })
	return out
}

// DescribeBehind says which members have not applied map version v, or
// cannot be read, naming at most three; "" if none.
func DescribeBehind(members []Applied, v uint64) string {
	var names []string
	for _, m := range members {
		switch {
		case m.Err != nil:
			names = append(names, fmt.Sprintf("%s (record unreadable: %v)", m.Path, m.Err))
		case m.MapVersion < v && m.Gone != nil:
			names = append(names, fmt.Sprintf("%s (at map version %d, %s)", m.Path, m.MapVersion, m.Gone))
		case m.MapVersion < v:
			names = append(names, fmt.Sprintf("%s (at map version %d)", m.Path, m.MapVersion))
		}
	}
	if len(names) == 0 {
		return ""
	}
	const show = 3
	list := strings.Join(names[:min(show, len(names))], ", ")
	if len(names) > show {
		list += fmt.Sprintf(" and %d more", len(names)-show)
	}
	return fmt.Sprintf("%d members have not applied map version %d: %s", len(names), v, list)
}

// DescribeStragglers lists stragglers for messages, each with its map
// version or why its record could not be used.
func DescribeStragglers(ss []topo.Straggler) string {
	parts := make([]string, len(ss))
	for i, st := range ss {
		if st.Error != "" {
			parts[i] = fmt.Sprintf("%s (%s)", st.Member, st.Error)
		} else {
			parts[i] = fmt.Sprintf("%s (map version %d)", st.Member, st.MapVersion)
		}
	}
	return strings.Join(parts, ", ")
}
