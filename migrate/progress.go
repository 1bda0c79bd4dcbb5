package migrate

import "github.com/shardvisor/shardvisor/topo"

// Progress is one line of progress, from a move (Options.Progress) or
// the rebalancer (Rebalancer.Progress): the one shape of progress
// callback, as gc.Progress is gc's.
type Progress struct {
	// Message is the line: a move state (topo.MoveCopy, topo.MoveDone,
	// ...) when a move enters it, or what happened ("copying: 1200 rows on
	// the target so far", the rebalancer's decisions).
	Message string
	// Move is the move's record as the mover holds it, read it in the
	// callback only; nil for the rebalancer's lines.
	Move *topo.MoveRecord
}
