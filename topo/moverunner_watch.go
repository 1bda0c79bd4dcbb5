package topo

import (
	"context"

	"github.com/shardvisor/shardvisor/zksession"
)

// WatchMoveRunner follows a move's runner lock node (Paths.MoveRunner):
// each Node says whether a mover holds the move (Exists) and, if so,
// which (Data, the holder's name). The node is ephemeral, so it goes away
// when its mover's session expires: the orphan watcher in package migrate
// resumes the move then.
func WatchMoveRunner(ctx context.Context, s *zksession.Session, p Paths, id string) *zksession.Watch {
	return s.Watch(ctx, p.MoveRunner(id))
}

// WatchMoves follows the list of move records (Paths.Moves): a new Node
// whenever a move is created or its record removed, not when a record
// changes. The orphan watcher in package migrate reads new records then.
func WatchMoves(ctx context.Context, s *zksession.Session, p Paths) *zksession.Watch {
	return s.WatchChildren(ctx, p.Moves())
}

// WatchMove follows one move's record (Paths.Move): a mover waiting for
// another to finish a move reads it again when it changes.
func WatchMove(ctx context.Context, s *zksession.Session, p Paths, id string) *zksession.Watch {
	return s.Watch(ctx, p.Move(id))
}
