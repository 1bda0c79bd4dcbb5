// Package ownership is every change of bucket ownership as one library
// call that also brings the db nodes' write fences along: a map edit by
// compare-and-swap through bucketmap.Store, then the fence sync
// (fence.SyncAfterChange) of every db node to the new map. A Go program
// that changes ownership through bucketmap.Store.Update directly leaves
// the fences behind; through this package it does not.
//
// The map change is the decision: once the compare-and-swap has succeeded
// nothing here undoes or fails it. A node whose fence could not be brought
// in step (unreachable, not prepared) is reported in the Result as drift,
// for `shardctl node reconcile` (Reconcile, Watch) to repair, never as an
// error.
//
// A move's flip is the exception: it writes the map and its move record in
// one transaction and brings exactly two fences, on connections it holds,
// to exactly the flip's version (Flip, then SettleFlip after it).
package ownership

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/topo"
)

// Options tune the fence sync after a change.
type Options struct {
	// Timeout bounds the fence sync of one node; 0: fence.DefaultSyncTimeout.
	Timeout time.Duration
	Logger  *zap.Logger // nil: no logs
}

// Changer changes ownership in one cluster's map, bringing the fences
// along.
type Changer struct {
	st  *bucketmap.Store
	opt Options
}

// New returns a Changer for the map of st.
func New(st *bucketmap.Store, opt Options) *Changer {
	return &Changer{st: st, opt: opt}
}

// Store is the map store the Changer writes through.
func (c *Changer) Store() *bucketmap.Store { return c.st }

// Result is one ownership change: the map it made and how each db node's
// fence followed it.
type Result struct {
	Map *bucketmap.Map // the map after the change
	// Fences is each node's fence outcome (fence.SyncAfterChange); nil when
	// the cluster has no sharded tables yet (nothing to fence) or when
	// FenceErr is set.
	Fences []fence.NodeSync
	// FenceErr: the cluster record could not be read, so no fence was
	// touched. The map change stands; every fence is drift.
	FenceErr error
}

// Drift is one fence left behind by a change.
type Drift struct {
	Node   bucketmap.NodeID // "" with Result.FenceErr: every node
	Status string           // a fence.Sync* status
	Detail string
}

// Drift lists the fences the change left behind: every node when the
// cluster record could not be read (one entry, Node ""), nodes without a
// fence, and nodes that could not be brought to the new map version.
func (r *Result) Drift() []Drift {
	if r.FenceErr != nil {
		return []Drift{{Status: fence.SyncFailed, Detail: r.FenceErr.Error()}}
	}
	var out []Drift
	for _, s := range r.Fences {
		switch s.Status {
		case fence.SyncInStep, fence.SyncRepaired, fence.SyncStale:
		default:
			out = append(out, Drift{Node: s.Node, Status: s.Status, Detail: s.Detail})
		}
	}
	return out
}

// Warnings are the lines to show a person for the drift, each naming the
// command that repairs it (`shardctl node reconcile`, or `shardctl node
// prepare` for a node with no fence): what shardctl prints, after
// "shardctl: warning: ", after every map change.
func (r *Result) Warnings() []string {
	if r.FenceErr != nil {
		return []string{fmt.Sprintf("fence drift: cannot read the cluster record to update the db nodes' fences to map version %d: %v; run `shardctl node reconcile`", r.Map.Version, r.FenceErr)}
	}
	var out []string
	for _, d := range r.Drift() {
		if d.Status == fence.SyncNotInstalled {
			out = append(out, fmt.Sprintf("fence drift: node %s has no fence installed, so writes to it are not fenced; run `shardctl node prepare %s`", d.Node, d.Node))
			continue
		}
		out = append(out, fmt.Sprintf("fence drift: node %s was not brought to map version %d (%s: %s); its fence keeps its previous ownership until `shardctl node reconcile` succeeds",
			d.Node, r.Map.Version, d.Status, d.Detail))
	}
	return out
}

// SyncAfter is the fence half of a change made elsewhere: it brings every
// db node's fence in step with m, the map a successful change produced
// (fence.SyncAfterChange), and never fails. Every method below ends with
// it; call it directly only for a map change this package has no method
// for.
func (c *Changer) SyncAfter(ctx context.Context, m *bucketmap.Map) *Result {
	res, err := fence.SyncAfterChange(ctx, c.st.Session(), c.st.Paths(), m, fence.SyncOptions{Timeout: c.opt.Timeout, Logger: c.opt.Logger})
	return &Result{Map: m, Fences: res, FenceErr: err}
}

// Change applies edit to the map by compare-and-swap (bucketmap.Store.Update,
// re-applied on a conflict) and then brings the fences along. An error is
// the map's: the map did not change and no fence was touched.
func (c *Changer) Change(ctx context.Context, edit func(m *bucketmap.Map) error) (*Result, error) {
	m, err := c.st.Update(ctx, edit)
	if err != nil {
		return nil, err
	}
	return c.SyncAfter(ctx, m), nil
}

// Create creates the cluster record and its first map (bucketmap.Store.Create)
// and brings the fences to it.
func (c *Changer) Create(ctx context.Context, rec topo.ClusterRecord, m *bucketmap.Map, opt bucketmap.CreateOptions) (*Result, error) {
	if err := c.st.Create(ctx, rec, m, opt); err != nil {
		return nil, err
	}
	return c.SyncAfter(ctx, m), nil
}

// Assign gives bucket b to node to (bucketmap.Map.Assign) and returns the
// node that owned it before. A bare bucket number (Depth
// bucketmap.AtLevel) is resolved on the map it edits.
func (c *Changer) Assign(ctx context.Context, b bucketmap.Bucket, to bucketmap.NodeID, opt bucketmap.AssignOptions) (from bucketmap.NodeID, res *Result, err error) {
	res, err = c.Change(ctx, func(m *bucketmap.Map) error {
		from = ""
		r, err := m.Resolve(b)
		if err != nil {
			return err
		}
		from = m.OwnerOf(r)
		return m.Assign(r, to, opt)
	})
	return from, res, err
}

// Split doubles the number of buckets times times (bucketmap.Map.Split),
// in one compare-and-swap.
func (c *Changer) Split(ctx context.Context, times int) (*Result, error) {
	return c.Change(ctx, func(m *bucketmap.Map) error {
		for range times {
			if err := m.Split(); err != nil {
				return err
			}
		}
		return nil
	})
}

// SplitBucket splits bucket b alone into its two halves
// (bucketmap.Map.SplitBucket), in one compare-and-swap. A bare bucket
// number (Depth bucketmap.AtLevel) is resolved on the map it edits.
func (c *Changer) SplitBucket(ctx context.Context, b bucketmap.Bucket) (*Result, error) {
	return c.Change(ctx, func(m *bucketmap.Map) error {
		r, err := m.Resolve(b)
		if err != nil {
			return err
		}
		return m.SplitBucket(r)
	})
}

// NodeDown marks node id down (bucketmap.Map.MarkDown): its buckets go at
// once to the active nodes, without copying. It returns the reassignments.
func (c *Changer) NodeDown(ctx context.Context, id bucketmap.NodeID) (moved []bucketmap.Move, res *Result, err error) {
	res, err = c.Change(ctx, func(m *bucketmap.Map) error {
		var err error
		moved, err = m.MarkDown(id)
		return err
	})
	return moved, res, err
}

// NodeUp makes node id active again (bucketmap.Map.Activate).
func (c *Changer) NodeUp(ctx context.Context, id bucketmap.NodeID) (*Result, error) {
	return c.Change(ctx, func(m *bucketmap.Map) error { return m.Activate(id) })
}

// Drain marks node id draining (bucketmap.Map.Drain): it keeps its buckets
// until moves take them.
func (c *Changer) Drain(ctx context.Context, id bucketmap.NodeID) (*Result, error) {
	return c.Change(ctx, func(m *bucketmap.Map) error { return m.Drain(id) })
}

// SetEncoding stores the map in encoding enc (bucketmap.Store.SetEncoding);
// a new map version like any other, so the fences follow it when it
// changed. res is nil when nothing changed.
func (c *Changer) SetEncoding(ctx context.Context, enc bucketmap.MapEncoding) (m *bucketmap.Map, res *Result, err error) {
	m, changed, err := c.st.SetEncoding(ctx, enc)
	if err != nil || !changed {
		return m, nil, err
	}
	return m, c.SyncAfter(ctx, m), nil
}
