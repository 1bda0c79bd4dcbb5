package topo

import (
	"context"
	"errors"
	"strings"

	"github.com/shardvisor/shardvisor/zksession"
)

// The watches and listing that fleet's member view is built on: the pools
// directory, a member directory (Paths.Routers or Paths.PoolMembers) and
// one member record.

// WatchPools watches the pools directory's children.
func WatchPools(ctx context.Context, s *zksession.Session, p Paths) *zksession.Watch {
	return s.WatchChildren(ctx, p.Pools())
}

// WatchMemberDir watches the children of a member directory.
func WatchMemberDir(ctx context.Context, s *zksession.Session, dir string) *zksession.Watch {
	return s.WatchChildren(ctx, dir)
}

// WatchMemberRecord watches one member record (its data, decoded by the
// caller with DecodeRouterMember or DecodePoolMember).
func WatchMemberRecord(ctx context.Context, s *zksession.Session, at string) *zksession.Watch {
	return s.Watch(ctx, at)
}

// ListMemberDir lists a directory's children with its Pzxid, so that a
// listing can be ordered against the watches' deliveries; exists is false
// (and no error) when the directory does not exist.
func ListMemberDir(ctx context.Context, s *zksession.Session, dir string) (names []string, pzxid int64, exists bool, err error) {
	names, st, err := s.Children(ctx, dir)
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, err
	}
	return names, st.Pzxid, true, nil
}

// MemberKind says what kind of member a member record path is: "router"
// or "supervisor" (for metric labels).
func (p Paths) MemberKind(member string) string {
	if strings.HasPrefix(member, p.Routers()+"/") {
		return "router"
	}
	return "supervisor"
}
