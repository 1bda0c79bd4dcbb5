package gc

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
)

// The checks a candidate range passes before anything is deleted (the
// package doc's list): both nodes' fences, and the rows on both.

// covered returns the fence's states over lo..hi: for each state, whether
// some key of the range has it.
func covered(f *fence.Fence, lo, hi int64) map[fence.State]bool {
	out := map[fence.State]bool{}
	probe := []fence.Span{{Lo: lo, Hi: hi, State: fence.Owned}}
	for _, d := range fence.Compare(probe, f.Spans) {
		if d.Want == fence.Owned { // inside lo..hi, where the fence is not owned
			out[d.Got] = true
		}
	}
	for _, s := range f.Spans {
		if s.Lo <= hi && lo <= s.Hi {
			out[s.State] = true
		}
	}
	return out
}

// verifyFences checks a candidate against both nodes' fences (each read
// once per run): the node's must not claim any of it, the owner's must
// own all of it.
func (g *GC) verifyFences(ctx context.Context, conns *connCache, r Range) *Skip {
	skip := func(kind, format string, args ...any) *Skip {
		return &Skip{Range: r, Kind: kind, Reason: fmt.Sprintf(format, args...), Uncertain: uncertain[kind]}
	}
	x, err := conns.get(ctx, r.Node)
	if err != nil {
		return skip(SkipNodeDown, "%s does not answer: %v", r.Node, err)
	}
	y, err := conns.get(ctx, r.Owner)
	if err != nil {
		return skip(SkipOwnerDown, "the current owner %s does not answer, so nobody can confirm it holds the rows: %v", r.Owner, err)
	}
	fx, err := conns.fenceOf(ctx, r.Node, x)
	if err != nil {
		return skip(SkipNodeDown, "reading %s's fence: %v", r.Node, err)
	}
	if fx != nil {
		st := covered(fx, r.KeyLo, r.KeyHi)
		for _, s := range []fence.State{fence.Owned, fence.Frozen, fence.Incoming} {
			if st[s] {
				return skip(SkipFence, "%s's fence still has part of the range %s (fence at map version %d, map at %d); run `shardctl node reconcile`", r.Node, s, fx.MapVersion, r.Version)
			}
		}
	}
	fy, err := conns.fenceOf(ctx, r.Owner, y)
	if err != nil {
		return skip(SkipOwnerDown, "reading the owner %s's fence: %v", r.Owner, err)
	}
	if fy == nil {
		return skip(SkipFence, "the owner %s has no fence installed, so it cannot be shown to own the range; run `shardctl node prepare %s`", r.Owner, r.Owner)
	}
	if st := covered(fy, r.KeyLo, r.KeyHi); st[fence.Absent] || st[fence.Frozen] || st[fence.Incoming] {
		return skip(SkipFence, "the owner %s's fence does not own all of the range (fence at map version %d)", r.Owner, fy.MapVersion)
	}
	return nil
}

// countKey names one count: a table's rows in a key range on a node.
type countKey struct {
	node   bucketmap.NodeID
	table  string
	lo, hi int64
}

type countResult struct {
	n   int64
	err error
}

// readNodes connects to every node the candidates name, all at once, and
// on each reads its fence (once per run) and counts every table's rows in
// every candidate range the node holds leftovers of or owns. Each node
// counts everything asked of it in one round trip and one snapshot: a
// read-only transaction with one statement per table that counts all of
// that node's ranges (see countRanges), however many ranges there are. A
// range whose fences then disagree was counted for nothing, which costs
// less than another round.
func (g *GC) readNodes(ctx context.Context, conns *connCache, ranges []Range) map[countKey]countResult {
	type span struct{ lo, hi int64 }
	need := map[bucketmap.NodeID][]span{}
	seen := map[bucketmap.NodeID]map[span]bool{}
	for _, r := range ranges {
		for _, id := range []bucketmap.NodeID{r.Node, r.Owner} {
			if seen[id] == nil {
				seen[id] = map[span]bool{}
			}
			if s := (span{r.KeyLo, r.KeyHi}); !seen[id][s] {
				seen[id][s] = true
				need[id] = append(need[id], s)
			}
		}
	}
	out := map[countKey]countResult{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, spans := range need {
		wg.Add(1)
		go func() {
			defer wg.Done()
			los, his := make([]int64, len(spans)), make([]int64, len(spans))
			for i, s := range spans {
				los[i], his[i] = s.lo, s.hi
			}
			conn, err := conns.get(ctx, id)
			var res map[string][]int64
			var errs map[string]error
			if err == nil {
				var f *fence.Fence
				if f, res, err = readNode(ctx, conn, g.Tables, los, his); err == nil {
					conns.setFence(id, f)
				} else if ctx.Err() == nil {
					// No fence, a table missing, or an error: the same
					// one step at a time, so that each answer gets its
					// own error (remembered with the fence and reported
					// by verifyFences).
					err = nil
					_, _ = conns.fenceOf(ctx, id, conn)
					res, errs = countRanges(ctx, conn, g.Tables, los, his)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, t := range g.Tables {
				for i, s := range spans {
					k := countKey{node: id, table: t.Name, lo: s.lo, hi: s.hi}
					switch {
					case err != nil:
						out[k] = countResult{err: err}
					case errs[t.Name] != nil:
						out[k] = countResult{err: errs[t.Name]}
					default:
						out[k] = countResult{n: res[t.Name][i]}
					}
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// verifyCounts checks a range's counts (countAll) on both nodes: for every
// table the owner must hold at least MinOwnerRatio times the node's rows.
func (g *GC) verifyCounts(r Range, counts map[countKey]countResult) (Work, *Skip) {
	skip := func(kind, format string, args ...any) (Work, *Skip) {
		return Work{}, &Skip{Range: r, Kind: kind, Reason: fmt.Sprintf(format, args...), Uncertain: uncertain[kind]}
	}
	w := Work{Range: r}
	for _, t := range g.Tables {
		x, ok1 := counts[countKey{node: r.Node, table: t.Name, lo: r.KeyLo, hi: r.KeyHi}]
		y, ok2 := counts[countKey{node: r.Owner, table: t.Name, lo: r.KeyLo, hi: r.KeyHi}]
		if !ok1 || !ok2 {
			return skip(SkipNodeDown, "counting %s: no count (a bug)", t.Name)
		}
		cx, errx, cy, erry := x.n, x.err, y.n, y.err
		if errx != nil {
			if isUndefinedTable(errx) {
				continue // nothing of it on this node
			}
			return skip(SkipNodeDown, "counting %s on %s: %v", t.Name, r.Node, errx)
		}
		if cx == 0 {
			w.Tables = append(w.Tables, TableWork{Table: t.Name})
			continue
		}
		if erry != nil {
			if isUndefinedTable(erry) {
				return skip(SkipTableMissing, "table %s does not exist on the owner %s, which should hold the range's %d rows", t.Name, r.Owner, cx)
			}
			return skip(SkipOwnerDown, "counting %s on the owner %s: %v", t.Name, r.Owner, erry)
		}
		if g.Opt.MinOwnerRatio > 0 && float64(cy) < g.Opt.MinOwnerRatio*float64(cx) {
			return skip(SkipOwnerRows, "%s has %d rows of %s in the range but the owner %s only %d (want at least %.2g times as many): the copy may be incomplete, or rows were deleted since; check, then rerun with --min-owner-ratio",
				r.Node, cx, t.Name, r.Owner, cy, g.Opt.MinOwnerRatio)
		}
		w.Tables = append(w.Tables, TableWork{Table: t.Name, Rows: cx, OwnerRows: cy})
	}
	return w, nil
}

func isUndefinedTable(err error) bool {
	return strings.Contains(err.Error(), "SQLSTATE 42P01")
}
