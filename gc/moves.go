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

// finished are move record states that are no longer in flight.
var finished = map[string]bool{"done": true, "aborted": true, "finished": true, "cancelled": true}

// ReadMoves reads every move record under p.Moves() tolerantly: GC only
// needs each record's "bucket" and "level" (and an optional "state": a
// move whose state is done, aborted, finished or cancelled is not in
// flight); other fields are ignored. A record that cannot be read that far
// counts as a move of every key, so GC deletes nothing while it is there:
// uncertainty never deletes. A missing moves/ directory means no moves.
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
		if mr, inFlight := parseMove(id, data); inFlight {
			out = append(out, mr)
		}
	}
	return out, nil
}

func parseMove(id string, data []byte) (MoveRange, bool) {
	all := func(format string, args ...any) (MoveRange, bool) {
		return MoveRange{ID: id, All: true, Lo: keystream.Key(0), Hi: keystream.Key(^uint64(0)), Why: fmt.Sprintf(format, args...)}, true
	}
	var rec struct {
		Bucket *int64  `json:"bucket"`
		Level  *int    `json:"level"`
		State  *string `json:"state"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return all("move record %s is not a JSON object: %v", id, err)
	}
	if rec.State != nil && finished[*rec.State] {
		return MoveRange{}, false
	}
	if rec.Bucket == nil || rec.Level == nil {
		return all(`move record %s has no "bucket" and "level"`, id)
	}
	if *rec.Bucket < 0 || *rec.Bucket > 1<<32-1 {
		return all("move record %s: bucket %d out of range", id, *rec.Bucket)
	}
	lo, hi, err := keystream.Range(*rec.Level, uint32(*rec.Bucket))
	if err != nil {
		return all("move record %s: %v", id, err)
	}
	return MoveRange{ID: id, Bucket: uint32(*rec.Bucket), Level: *rec.Level, Lo: lo, Hi: hi}, true
}
