package gc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// MoveRange is the key range of a move in flight, read from its record
// under moves/.
type MoveRange struct {
	ID     string
	Bucket uint32
	Level  int
	Lo, Hi int64 // keys; Lo > Hi never; All means unreadable: everything
	All    bool
	Why    string // why All
}

// ReadMoves reads every move record under p.Moves() through the type the
// mover writes (topo.MoveRecord, decoded by topo.DecodeMove): a move whose
// state is final (topo.MoveStateFinal: done or aborted) is not in flight;
// a move in any other state the movers write is in flight over its
// bucket's key range. A record that does not decode, or whose state this
// build does not know, counts as a move of every key, so GC deletes
// nothing while it is there: uncertainty never deletes. A missing moves/
// directory means no moves.
func ReadMoves(ctx context.Context, s *zksession.Session, p topo.Paths) ([]MoveRange, error) {
	ids, err := topo.ListMoves(ctx, s, p)
	if err != nil {
		return nil, err
	}
	var out []MoveRange
	for _, id := range ids {
		data, _, err := topo.ReadMoveData(ctx, s, p, id)
		if errors.Is(err, zksession.ErrNoNode) {
			continue // finished meanwhile
		}
		if err != nil {
			return nil, err
		}
		if mr, inFlight := parseMove(p.Move(id), id, data); inFlight {
			out = append(out, mr)
		}
	}
	return out, nil
}

// parseMove decodes one move record strictly (topo.DecodeMove) and
// returns its range and whether it is in flight.
//
// A decode error is deliberately not returned: the strict decoder also
// refuses records GC cannot understand but a mover may well be running (a
// newer format version from a newer mover, a field this build does not
// know), and such a move may be copying any range. Aborting the run would
// be safe too, but would hide which record is the cause and stop the
// checks of everything else; counting the record as a move of every key
// keeps GC running, deleting nothing, and the report names the record
// (SkipMoveRecord) until an operator or the mover deals with it.
func parseMove(znode, id string, data []byte) (MoveRange, bool) {
	all := func(format string, args ...any) (MoveRange, bool) {
		return MoveRange{ID: id, All: true, Lo: keystream.Key(0), Hi: keystream.Key(^uint64(0)), Why: fmt.Sprintf(format, args...)}, true
	}
	rec, err := topo.DecodeMove(znode, data)
	if err != nil {
		return all("move record %s cannot be read: %v", id, err)
	}
	// The strict decoder fills a missing or null bucket or level with 0:
	// for GC that would be "bucket 0", a guess. Without both, the record
	// says nothing of its range.
	var where struct {
		Bucket *uint32 `json:"bucket"`
		Level  *int    `json:"level"`
	}
	if err := json.Unmarshal(data, &where); err != nil || where.Bucket == nil || where.Level == nil {
		return all("move record %s does not say which bucket it moves (bucket and level)", id)
	}
	if topo.MoveStateFinal(rec.State) {
		return MoveRange{}, false
	}
	if !topo.MoveStateKnown(rec.State) {
		return all("move record %s has state %q, which this build does not know", id, rec.State)
	}
	lo, hi, err := keystream.Range(rec.Level, rec.Bucket)
	if err != nil {
		return all("move record %s: %v", id, err)
	}
	return MoveRange{ID: id, Bucket: rec.Bucket, Level: rec.Level, Lo: lo, Hi: hi}, true
}
