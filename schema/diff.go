package schema

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/topo"
)

// DiffResult is the comparison of every node's sharded tables with one
// reference node's (fence.CompareSchemas, the comparison a move makes
// before it copies), and of every node's applied changes with the
// recorded history.
type DiffResult struct {
	Reference   string             `json:"reference"`
	Nodes       []string           `json:"nodes"`
	Tables      int                `json:"tables"`
	Unreachable []NodeError        `json:"unreachable"`
	Diffs       []fence.SchemaDiff `json:"differences"`
	// Behind lists, per node, the recorded changes its own table does not
	// have as applied (a node that missed a change, or never had one).
	Behind    map[string][]string `json:"behind"`
	ElapsedMS float64             `json:"elapsed_ms"`
}

// NodeError is a node that could not be read.
type NodeError struct {
	Node  string `json:"node"`
	Error string `json:"error"`
}

// Drift reports whether the result found anything out of step.
func (r *DiffResult) Drift() bool { return len(r.Diffs) > 0 || len(r.Behind) > 0 }

// Blocking counts the differences that would refuse a move.
func (r *DiffResult) Blocking() int { return len(fence.Blocking(r.Diffs)) }

type nodeView struct {
	schemas []fence.TableSchema
	rows    map[string]nodeRow
	err     error
}

// Diff reads every node not marked down or removed, all at once, and compares each
// with reference ("" picks the first reachable node by id).
func Diff(ctx context.Context, m *bucketmap.Map, tables []topo.TableRecord, hist []*topo.SchemaChange, reference string, connectTimeout time.Duration) (*DiffResult, error) {
	start := time.Now()
	if connectTimeout <= 0 {
		connectTimeout = 10 * time.Second
	}
	nodes := m.LiveNodes()
	slices.SortFunc(nodes, func(a, b bucketmap.Node) int { return strings.Compare(string(a.ID), string(b.ID)) })
	if reference != "" && !slices.ContainsFunc(nodes, func(n bucketmap.Node) bool { return string(n.ID) == reference }) {
		return nil, fmt.Errorf("--reference %s: %w among the nodes not marked down or removed", reference, ErrUnknownNode)
	}
	views := make([]nodeView, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			views[i] = readNode(ctx, n, tables, connectTimeout)
		}()
	}
	wg.Wait()
	res := &DiffResult{Tables: len(tables), Unreachable: []NodeError{}, Diffs: []fence.SchemaDiff{}, Behind: map[string][]string{}}
	ref := -1
	for i, n := range nodes {
		res.Nodes = append(res.Nodes, string(n.ID))
		if views[i].err != nil {
			res.Unreachable = append(res.Unreachable, NodeError{Node: string(n.ID), Error: views[i].err.Error()})
			continue
		}
		if ref < 0 && (reference == "" || string(n.ID) == reference) {
			ref = i
		}
		var behind []string
		for _, c := range hist {
			if FailedNowhere(c) {
				continue
			}
			if r, ok := views[i].rows[c.ID]; !ok || !r.Done || r.SHA256 != c.SHA256 {
				behind = append(behind, c.ID)
			}
		}
		if len(behind) > 0 {
			res.Behind[string(n.ID)] = behind
		}
	}
	if ref < 0 {
		res.ElapsedMS = ms(time.Since(start))
		if len(nodes) == 0 {
			return res, errors.New("no node to compare: every node is marked down or the registry is empty")
		}
		return res, fmt.Errorf("no node could be read: %s", res.Unreachable[0].Error)
	}
	res.Reference = string(nodes[ref].ID)
	for i, n := range nodes {
		if i == ref || views[i].err != nil {
			continue
		}
		res.Diffs = append(res.Diffs, fence.CompareSchemas(res.Reference, views[ref].schemas, string(n.ID), views[i].schemas)...)
	}
	res.ElapsedMS = ms(time.Since(start))
	return res, nil
}

func readNode(ctx context.Context, n bucketmap.Node, tables []topo.TableRecord, timeout time.Duration) nodeView {
	conn, err := connect(ctx, n, timeout)
	if err != nil {
		return nodeView{err: err}
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var v nodeView
	if v.schemas, err = fence.ReadSchemas(ctx, conn, tables); err != nil {
		return nodeView{err: err}
	}
	v.rows, v.err = readRowsIfAny(ctx, conn)
	return v
}

// readRowsIfAny reads a node's change rows; none if it has no table yet.
func readRowsIfAny(ctx context.Context, conn *pgx.Conn) (map[string]nodeRow, error) {
	if ok, err := historyExists(ctx, conn); !ok || err != nil {
		return map[string]nodeRow{}, err
	}
	return readRows(ctx, conn)
}

// DriftRecord is the record of a diff for the status page and metrics.
func DriftRecord(r *DiffResult, by string) *topo.SchemaDrift {
	d := &topo.SchemaDrift{Version: topo.SchemaDriftVersion, At: time.Now().UTC(), By: by, Reference: r.Reference, Nodes: r.Nodes,
		Count: len(r.Diffs), Blocking: r.Blocking(), Tables: r.Tables, ElapsedMS: r.ElapsedMS}
	for _, u := range r.Unreachable {
		d.Skipped = append(d.Skipped, u.Node)
	}
	for _, x := range r.Diffs {
		if len(d.Sample) < 10 {
			d.Sample = append(d.Sample, fmt.Sprintf("%s vs %s: %s", x.Nodes[0], x.Nodes[1], x.Message))
		}
	}
	for _, n := range r.Nodes {
		if b := r.Behind[n]; len(b) > 0 {
			d.Count += len(b)
			if len(d.Sample) < 10 {
				d.Sample = append(d.Sample, fmt.Sprintf("%s lacks %d recorded changes (first %s)", n, len(b), b[0]))
			}
		}
	}
	return d
}
