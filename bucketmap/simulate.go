package bucketmap

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// SimEvent is one change an operator wants to try offline.
type SimEvent struct {
	Kind   string // add, down, drain, up, remove, weight, split
	Node   NodeID
	Weight int
	// Bucket is split's one bucket (split:BUCKET); nil splits them all.
	Bucket *Bucket
}

func (e SimEvent) String() string {
	switch e.Kind {
	case "split":
		if e.Bucket != nil {
			if e.Bucket.Depth == AtLevel {
				return fmt.Sprintf("split:%d", e.Bucket.Prefix)
			}
			return "split:" + e.Bucket.String()
		}
		return "split"
	case "add", "weight":
		return fmt.Sprintf("%s:%s=%d", e.Kind, e.Node, e.Weight)
	}
	return e.Kind + ":" + string(e.Node)
}

// ParseSimEvent parses add:ID[=WEIGHT], down:ID, drain:ID, up:ID,
// remove:ID, weight:ID=W, split and split:BUCKET.
func ParseSimEvent(s string) (SimEvent, error) {
	if s == "split" {
		return SimEvent{Kind: "split"}, nil
	}
	if b, ok := strings.CutPrefix(s, "split:"); ok {
		bk, err := ParseBucket(b)
		if err != nil {
			return SimEvent{}, fmt.Errorf("event %q: %v", s, err)
		}
		return SimEvent{Kind: "split", Bucket: &bk}, nil
	}
	kind, arg, ok := strings.Cut(s, ":")
	if !ok || arg == "" {
		return SimEvent{}, fmt.Errorf("event %q: want KIND:NODE (add, down, drain, up, remove, weight) or split", s)
	}
	e := SimEvent{Kind: kind}
	id, w, hasW := strings.Cut(arg, "=")
	e.Node = NodeID(id)
	switch kind {
	case "add", "weight":
		e.Weight = 1
		if hasW {
			n, err := strconv.Atoi(w)
			if err != nil || n < 1 || n > MaxWeight {
				return SimEvent{}, fmt.Errorf("event %q: weight %q is not a number in 1..%d", s, w, MaxWeight)
			}
			e.Weight = n
		} else if kind == "weight" {
			return SimEvent{}, fmt.Errorf("event %q: want weight:NODE=W", s)
		}
	case "down", "drain", "up", "remove":
		if hasW {
			return SimEvent{}, fmt.Errorf("event %q: %s takes no weight", s, kind)
		}
	default:
		return SimEvent{}, fmt.Errorf("event %q: unknown kind %q (add, down, drain, up, remove, weight, split)", s, kind)
	}
	return e, nil
}

// SimNode is a node for an offline simulation: it needs no real DSN.
func SimNode(id NodeID, weight int) Node {
	return Node{ID: id, DSN: "postgres://sim@" + string(id) + "/sim", Weight: weight, State: NodeActive}
}

// SimStep is what one event cost.
type SimStep struct {
	Event      string         `json:"event"`
	Splits     int            `json:"splits"`
	Level      int            `json:"level"`     // the deepest bucket's depth
	MinDepth   int            `json:"min_depth"` // Level at one depth
	Buckets    int            `json:"buckets"`
	Reassigned int            `json:"reassigned"`
	Moves      int            `json:"moves"`
	LowerBound int            `json:"lower_bound"`
	Counts     map[NodeID]int `json:"counts"`
}

// Simulate applies events to a copy of m one at a time; after each, the
// rebalancer's plan runs to completion as if every copy had finished. It
// reports each step's cost and returns the final map.
func Simulate(m *Map, events []SimEvent, pol Policy) ([]SimStep, *Map, error) {
	cur := m.Clone()
	var steps []SimStep
	for _, e := range events {
		cur.Version++
		cur.UpdatedAt = cur.UpdatedAt.Add(time.Minute)
		st := SimStep{Event: e.String()}
		var err error
		switch e.Kind {
		case "add":
			err = cur.AddNode(SimNode(e.Node, e.Weight))
		case "down":
			var re []Move
			re, err = cur.MarkDown(e.Node)
			st.Reassigned = len(re)
		case "drain":
			err = cur.Drain(e.Node)
		case "up":
			err = cur.Activate(e.Node)
		case "remove":
			err = cur.RemoveNode(e.Node)
		case "weight":
			err = cur.SetWeight(e.Node, e.Weight)
		case "split":
			if e.Bucket == nil {
				err = cur.Split()
				break
			}
			var b Bucket
			if b, err = cur.Resolve(*e.Bucket); err == nil {
				err = cur.SplitBucket(b)
			}
		}
		if err != nil {
			return steps, cur, fmt.Errorf("%s: %w", e, err)
		}
		p, err := PlanFor(cur, pol)
		if err != nil {
			return steps, cur, fmt.Errorf("%s: plan: %w", e, err)
		}
		if err := cur.Apply(p); err != nil {
			return steps, cur, fmt.Errorf("%s: apply: %w", e, err)
		}
		st.Splits, st.Moves, st.LowerBound = p.Splits, len(p.Moves), p.LowerBound
		st.Reassigned += len(p.Reassign)
		st.Level, st.MinDepth, st.Buckets = cur.Level, cur.MinDepth(), cur.Buckets()
		st.Counts = cur.Counts()
		steps = append(steps, st)
	}
	return steps, cur, nil
}
