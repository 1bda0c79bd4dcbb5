package topo

import (
	"context"
	"errors"

	"github.com/shardvisor/shardvisor/zksession"
)

// Move and rebalance records in ZooKeeper. Move records are written compact
// (json.Marshal, as the mover always has); the rebalance record indented
// (Encode). A missing record is reported with the session's error, so
// callers keep testing errors.Is(err, zksession.ErrNoNode).

// ListMoves lists the ids of the move records under Paths.Moves(), in the
// server's order. A missing moves directory means no moves.
func ListMoves(ctx context.Context, s *zksession.Session, p Paths) ([]string, error) {
	kids, _, err := s.Children(ctx, p.Moves())
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, nil
	}
	return kids, err
}

// ReadMoveData reads a move record's bytes as stored, for readers that
// decide themselves what an undecodable record means (GC decodes with
// DecodeMove and counts a record it cannot decode as a move of every key).
func ReadMoveData(ctx context.Context, s *zksession.Session, p Paths, id string) ([]byte, int32, error) {
	data, st, err := s.Get(ctx, p.Move(id))
	return data, st.Version, err
}

// ReadMove reads and decodes a move record, with its znode version for
// UpdateMove.
func ReadMove(ctx context.Context, s *zksession.Session, p Paths, id string) (*MoveRecord, int32, error) {
	return readAs(ctx, s, p.Move(id), DecodeMove)
}

// CreateMove creates the record of a new move at Paths.Move(rec.ID),
// creating the moves directory if needed.
func CreateMove(ctx context.Context, s *zksession.Session, p Paths, rec *MoveRecord) error {
	data, err := EncodeCompact(rec)
	if err != nil {
		return err
	}
	return createNode(ctx, s, p, p.Move(rec.ID), data)
}

// UpdateMove writes rec by compare-and-swap on version (from ReadMove or
// the previous UpdateMove) and returns the new version. A conflict is
// zksession.ErrBadVersion: only the runner holding the move's lock writes
// its record, so the caller decides, never this function.
func UpdateMove(ctx context.Context, s *zksession.Session, p Paths, rec *MoveRecord, version int32) (int32, error) {
	data, err := EncodeCompact(rec)
	if err != nil {
		return 0, err
	}
	st, err := s.Set(ctx, p.Move(rec.ID), data, version)
	if err != nil {
		return 0, err
	}
	return st.Version, nil
}

// UpdateMoveOp is UpdateMove as one operation of a zksession.Multi
// transaction (the flip writes the map and the move record together). The
// record's new version is the transaction's Stat for this operation.
func UpdateMoveOp(p Paths, rec *MoveRecord, version int32) (zksession.Op, error) {
	data, err := EncodeCompact(rec)
	if err != nil {
		return zksession.Op{}, err
	}
	return zksession.SetOp(p.Move(rec.ID), data, version), nil
}

// ReadRebalance reads the rebalancer's record; nil, nil when there is none
// (never paused).
func ReadRebalance(ctx context.Context, s *zksession.Session, p Paths) (*RebalanceRecord, error) {
	data, _, err := s.Get(ctx, p.Rebalance())
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return DecodeRebalance(p.Rebalance(), data)
}

// WriteRebalance replaces the rebalancer's record, creating it if needed.
// Last writer wins: pause and resume are operator decisions, not
// read-modify-write.
func WriteRebalance(ctx context.Context, s *zksession.Session, p Paths, rec RebalanceRecord) error {
	data, err := Encode(rec)
	if err != nil {
		return err
	}
	_, err = s.Set(ctx, p.Rebalance(), data, zksession.AnyVersion)
	if errors.Is(err, zksession.ErrNoNode) {
		return createNode(ctx, s, p, p.Rebalance(), data)
	}
	return err
}

// WatchRebalance follows the rebalancer's record (Paths.Rebalance); each
// Node carries the record's bytes (DecodeRebalance) or Exists false.
func WatchRebalance(ctx context.Context, s *zksession.Session, p Paths) *zksession.Watch {
	return s.Watch(ctx, p.Rebalance())
}

// LockMoveRunner takes the move's runner lock (Paths.MoveRunner), naming
// runner as its holder, so that two movers never run the same move. It
// fails at once, with an error wrapping zksession.ErrLocked (a
// *zksession.LockedError naming the holder), when another session runs
// it. The lock is tied to the session: its Done channel closes when it is
// lost, and the runner must then stop touching the move.
func LockMoveRunner(ctx context.Context, s *zksession.Session, p Paths, id, runner string) (*zksession.Lock, error) {
	return tryLock(ctx, s, p, p.MoveRunner(id), []byte(runner))
}
