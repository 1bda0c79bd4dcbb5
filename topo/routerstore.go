package topo

import (
	"context"

	"github.com/shardvisor/shardvisor/zksession"
)

// WatchMap follows the cluster's bucket map record (Paths.Map). Each Node
// carries the record's bytes as stored; package bucketmap, a layer above,
// decodes and validates them, and the map file embeds them unchanged.
func WatchMap(ctx context.Context, s *zksession.Session, p Paths) *zksession.Watch {
	return s.Watch(ctx, p.Map())
}

// RouterRegistration is a router's ephemeral member record at
// Paths.Router(id), kept alive across sessions until Remove.
type RouterRegistration struct {
	e *zksession.Ephemeral
}

// RegisterRouter creates the member record of router rec.ID (the routers
// directory lets readers register there).
func RegisterRouter(ctx context.Context, s *zksession.Session, p Paths, rec RouterMember) (*RouterRegistration, error) {
	e, err := createEphemeralRecord(ctx, s, p, p.Router(rec.ID), rec)
	if err != nil {
		return nil, err
	}
	return &RouterRegistration{e: e}, nil
}

// Update replaces the record (for example with a newly applied map
// version). When it fails because the session is away, the new record is
// still the one re-created or re-sent when the session comes back.
func (r *RouterRegistration) Update(ctx context.Context, rec RouterMember) error {
	return setEphemeralRecord(ctx, r.e, rec)
}

// Remove deletes the record and stops keeping it alive.
func (r *RouterRegistration) Remove(ctx context.Context) error {
	return removeMember(ctx, r.e)
}
