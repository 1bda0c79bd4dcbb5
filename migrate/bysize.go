package migrate

import (
	"context"
	"fmt"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/ownership"
	"github.com/shardvisor/shardvisor/sizing"
	"github.com/shardvisor/shardvisor/topo"
)

// PlanBySize measures every bucket of m on its owner (opt) and returns
// the planner by size's answer, holding the buckets of unfinished moves
// (neither split nor moved), with the measurement: what `shardctl plan
// --by size` shows and each round of `rebalance --by size` runs.
func PlanBySize(ctx context.Context, st *bucketmap.Store, m *bucketmap.Map, pol bucketmap.SizePolicy, opt sizing.Options) (*bucketmap.SizePlan, *sizing.Report, error) {
	crec, err := topo.ReadCluster(ctx, st.Session(), st.Paths())
	if err != nil {
		return nil, nil, err
	}
	// A bucket with an unfinished move (copying, or in its rollback
	// window) is neither split (its move would find it gone, or could not
	// roll back) nor moved again: the plan works around it.
	busy, err := unfinished(ctx, st, func(*topo.MoveRecord) bool { return true })
	if err != nil {
		return nil, nil, err
	}
	pol.Hold = map[bucketmap.Bucket]bool{}
	for _, rec := range busy {
		for _, b := range overlapping(m, recBucket(rec)) {
			pol.Hold[b] = true
		}
	}
	rep, err := sizing.Measure(ctx, m, crec.Tables, opt)
	if err != nil {
		return nil, nil, err
	}
	p, err := bucketmap.PlanBySize(m, rep.Sizes, pol)
	return p, rep, err
}

// runBySize is Run balancing by size: measure, plan, split what the plan
// splits (one compare-and-swap, through ownership so the fences follow),
// run the next moves, and measure again, until every node is within the
// tolerance or nothing more can be done (said in the report).
func (rb *Rebalancer) runBySize(ctx context.Context, rep *Report, retry map[bucketmap.Bucket]*backoff.Backoff) error {
	pol := *rb.BySize
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, _, err := rb.mv.st.Load(ctx)
		if err != nil {
			return err
		}
		if err := rb.check(ctx, m); err != nil {
			return err
		}
		p, meas, err := PlanBySize(ctx, rb.mv.st, m, pol, rb.Sizing)
		if err != nil {
			return err
		}
		rep.MaxOverFair, rep.Stuck = p.MaxOverFair, p.Stuck
		rep.Measured = meas.Nodes
		if len(p.Split)+len(p.Moves) > 0 {
			if err := rb.beforeChanges(ctx); err != nil {
				return err
			}
		}
		if splits := p.Split; len(splits) > 0 {
			rb.say("splitting %d bucket(s) before moving: %v", len(splits), splits)
			if _, err := ownership.New(rb.mv.st, ownership.Options{Logger: rb.log}).Change(ctx, func(m *bucketmap.Map) error {
				for _, b := range splits {
					if err := m.SplitBucket(b); err != nil {
						return fmt.Errorf("split %s: %w", b, err)
					}
				}
				return nil
			}); err != nil {
				return err
			}
			rep.SplitBuckets = append(rep.SplitBuckets, splits...)
			continue
		}
		if len(p.Moves) == 0 {
			rep.Balanced = p.Balanced
			// What GC leaves: the owned rows and their live bytes (the
			// plan's ratio is the measure it balanced).
			rep.MaxOverFairRows, rep.MaxOverFairBytes = OverFair(m, meas.Nodes)
			if p.Balanced {
				rb.say("balanced by %s: every node within %.0f%% of its fair share (largest at %.3f; in owned live bytes %.3f, in owned rows %.3f)", p.By, 100*p.Tolerance, p.MaxOverFair, rep.MaxOverFairBytes, rep.MaxOverFairRows)
			} else {
				rb.say("as balanced by %s as it can be made: largest at %.3f of its fair share (in owned live bytes %.3f, in owned rows %.3f); %v %v", p.By, p.MaxOverFair, rep.MaxOverFairBytes, rep.MaxOverFairRows, p.Stuck, p.Unknown)
			}
			return nil
		}
		var inFlight []bucketmap.Move
		if rb.watcherRuns {
			if inFlight, err = rb.unfinished(ctx, m); err != nil {
				return err
			}
		}
		batch := bucketmap.Schedule(p.Moves, inFlight, rb.pol.Concurrency)
		if len(batch) == 0 {
			return fmt.Errorf("%w: %d unfinished, %d planned", ErrWaitingForMoves, len(inFlight), len(p.Moves))
		}
		rb.say("%d moves left by %s (largest at %.3f of its fair share, after the plan %.3f); starting %d", len(p.Moves), p.By, maxRatio(p), p.MaxOverFair, len(batch))
		if err := rb.runBatch(ctx, rep, batch, retry); err != nil {
			return err
		}
	}
}

// overlapping lists m's buckets that share keys with b: b itself, the
// buckets it was split into, or the one it is part of now.
func overlapping(m *bucketmap.Map, b bucketmap.Bucket) []bucketmap.Bucket {
	if b.Depth > m.Level {
		lo, _ := b.Keys()
		return []bucketmap.Bucket{m.BucketOfPrefix(keystream.PrefixFromKey(lo))}
	}
	var out []bucketmap.Bucket
	lo, hi := m.SlotsOf(b)
	for s := lo; s <= hi; {
		c := m.BucketAt(s)
		out = append(out, c)
		_, last := m.SlotsOf(c)
		s = last + 1
		if last == ^uint32(0) {
			break
		}
	}
	return out
}

// maxRatio is the largest before/fair ratio of a plan's active nodes.
func maxRatio(p *bucketmap.SizePlan) float64 {
	r := 0.0
	for id, f := range p.Fair {
		if f > 0 {
			r = max(r, float64(p.Before[id])/float64(f))
		}
	}
	return r
}

// OverFair is the largest owned/fair-share ratio over m's active nodes,
// in rows and in live bytes, of a measurement: what each node will hold
// once GC has deleted its leftovers. A node's fair share is the total
// times its weight over the active weights, as the planner's.
func OverFair(m *bucketmap.Map, nodes []sizing.NodeReport) (rows, bytes float64) {
	var total bucketmap.Size
	var totalW int64
	owned := map[bucketmap.NodeID]bucketmap.Size{}
	for _, n := range nodes {
		owned[n.Node] = n.Owned
		total.Rows += n.Owned.Rows
		total.Bytes += n.Owned.Bytes
	}
	for _, n := range m.Nodes() {
		if n.State == bucketmap.NodeActive {
			totalW += int64(n.Weight)
		}
	}
	if totalW == 0 {
		return 0, 0
	}
	for _, n := range m.Nodes() {
		if n.State != bucketmap.NodeActive {
			continue
		}
		share := float64(n.Weight) / float64(totalW)
		if total.Rows > 0 {
			rows = max(rows, float64(owned[n.ID].Rows)/(share*float64(total.Rows)))
		}
		if total.Bytes > 0 {
			bytes = max(bytes, float64(owned[n.ID].Bytes)/(share*float64(total.Bytes)))
		}
	}
	return rows, bytes
}
