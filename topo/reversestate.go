package topo

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/shardvisor/shardvisor/zksession"
)

// MoveReverseState is where the watcher that probes a move's reverse
// stream (`rebalance --watch`) publishes what the servers said, for the
// readers that cannot ask them (the status page: routers have no
// replication access). Not in the move record: a probe every few seconds
// would race every compare-and-swap of the move's runner.
func (p Paths) MoveReverseState(id string) string { return path.Join(p.Move(id), "reverse") }

// ReverseStateVersion is the newest reverse stream state format this
// build writes.
const ReverseStateVersion = 1

// ReverseState is a move's reverse stream as read from its servers at At.
type ReverseState struct {
	Version int `json:"version,omitempty"`
	// State: running, disabled (an apply error stopped it; a rollback
	// enables it again), lost (no rollback possible), unknown (a node did
	// not answer).
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// LagBytes is the target's WAL written since the slot's confirmed
	// position: what the source has not confirmed yet (nil: not known).
	LagBytes *int64 `json:"lag_bytes,omitempty"`
	// WALStatus is the slot's wal_status (reserved, extended,
	// unreserved: about to be invalidated, lost).
	WALStatus string    `json:"wal_status,omitempty"`
	At        time.Time `json:"at"`
	By        string    `json:"by,omitempty"` // the process that probed it
}

// DecodeReverseState decodes a published reverse stream state.
func DecodeReverseState(znode string, data []byte) (*ReverseState, error) {
	return decodeAs[ReverseState]("reverse stream state", znode, data, ReverseStateVersion, nil)
}

// WriteReverseState publishes the state of move id's reverse stream,
// creating its znode if needed (never the move's: zksession.ErrNoNode
// without one). A probe older than the one published is dropped: two
// watchers (one losing the rebalance lock as another takes it) never put
// an older reading over a newer one.
func WriteReverseState(ctx context.Context, s *zksession.Session, p Paths, id string, st ReverseState) error {
	st.Version = ReverseStateVersion
	data, err := Encode(st)
	if err != nil {
		return err
	}
	at := p.MoveReverseState(id)
	for range 3 {
		old, stat, err := s.Get(ctx, at)
		switch {
		case errors.Is(err, zksession.ErrNoNode):
			if err = createChild(ctx, s, p, at, data); !errors.Is(err, zksession.ErrNodeExists) {
				return err
			}
			continue // another watcher's, a moment ago
		case err != nil:
			return err
		}
		if prev, err := DecodeReverseState(at, old); err == nil && prev.At.After(st.At) {
			return nil
		}
		if _, err = s.Set(ctx, at, data, stat.Version); !errors.Is(err, zksession.ErrBadVersion) {
			return err
		}
	}
	return fmt.Errorf("publishing the reverse stream state of move %s: it kept changing under this write", id)
}

// ReadReverseState reads the published state of move id's reverse
// stream; nil, nil when none was published.
func ReadReverseState(ctx context.Context, s *zksession.Session, p Paths, id string) (*ReverseState, error) {
	at := p.MoveReverseState(id)
	data, _, err := s.Get(ctx, at)
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return DecodeReverseState(at, data)
}
