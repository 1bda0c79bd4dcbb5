package gc

import (
	"context"
	"fmt"
	"strings"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Member is one live router's or supervisor's applied map version, from
// its member record.
type Member struct {
	Path       string
	MapVersion uint64
	Err        error // the record does not decode
}

// ReadMembers reads every live member record (routers, and every pool's
// supervisors) once per run. A member still routing by a map from before a
// range changed owner may read the range on its old owner; a move no longer
// waits for such stragglers (docs/moves.md, "Stragglers"), so GC does.
func ReadMembers(ctx context.Context, s *zksession.Session, p topo.Paths) ([]Member, error) {
	var out []Member
	routers, err := topo.ListRouters(ctx, s, p)
	if err != nil {
		return nil, err
	}
	for _, e := range routers {
		m := Member{Path: e.Path, Err: e.Err}
		if e.Rec != nil {
			m.MapVersion = e.Rec.MapVersion
		}
		out = append(out, m)
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
			m := Member{Path: e.Path, Err: e.Err}
			if e.Rec != nil {
				m.MapVersion = e.Rec.MapVersion
			}
			out = append(out, m)
		}
	}
	return out, nil
}

// behind says which members have not applied map version v, or cannot be
// read (uncertainty never deletes); "" if none.
func behind(members []Member, v uint64) string {
	var names []string
	for _, m := range members {
		switch {
		case m.Err != nil:
			names = append(names, fmt.Sprintf("%s (record unreadable: %v)", m.Path, m.Err))
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
