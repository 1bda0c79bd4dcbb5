package migrate

import (
	"context"
	"fmt"
	"slices"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/ownership"
	"github.com/shardvisor/shardvisor/sizing"
	"github.com/shardvisor/shardvisor/topo"
)

// PlanBySize measures every bucket on its owner and returns the planner
// by size's answer for the live map, with the measurement.
func (rb *Rebalancer) PlanBySize(ctx context.Context, pol bucketmap.SizePolicy) (*bucketmap.SizePlan, *sizing.Report, error) {
	m, _, err := rb.mv.st.Load(ctx)
	if err != nil {
		return nil, nil, err
	}
	return rb.planBySize(ctx, m, pol)
}

func (rb *Rebalancer) planBySize(ctx context.Context, m *bucketmap.Map, pol bucketmap.SizePolicy) (*bucketmap.SizePlan, *sizing.Report, error) {
	crec, err := topo.ReadCluster(ctx, rb.mv.s, rb.mv.p)
	if err != nil {
		return nil, nil, err
	}
	rep, err := sizing.Measure(ctx, m, crec.Tables, rb.Sizing)
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
		p, _, err := rb.planBySize(ctx, m, pol)
		if err != nil {
			return err
		}
		rep.MaxOverFair, rep.Stuck = p.MaxOverFair, p.Stuck
		held, err := rb.inWindow(ctx, m)
		if err != nil {
			return err
		}
		// A bucket in a move's rollback window is neither split (its
		// rollback could not run) nor moved until that move ends.
		splits := slices.DeleteFunc(slices.Clone(p.Split), func(b bucketmap.Bucket) bool { return held[b] })
		if len(splits) > 0 {
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
		planned := len(p.Moves)
		p.Moves = slices.DeleteFunc(p.Moves, func(mv bucketmap.Move) bool { return held[mv.Bucket] })
		if len(p.Moves) == 0 && planned > 0 {
			return fmt.Errorf("%w: %d planned moves wait for buckets in a move's rollback window (shardctl moves; shardctl move complete ID ends one)", ErrWaitingForMoves, planned)
		}
		if len(p.Moves) == 0 {
			rep.Balanced = p.Balanced
			if p.Balanced {
				rb.say("balanced by %s: every node within %.0f%% of its fair share (largest at %.3f)", p.By, 100*pol.Tolerance, p.MaxOverFair)
			} else {
				rb.say("as balanced by %s as it can be made: largest at %.3f of its fair share; %v %v", p.By, p.MaxOverFair, p.Stuck, p.Unknown)
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
