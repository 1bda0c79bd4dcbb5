package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

// baseline copies the ranges of a few moved buckets again, from the same
// source to the same target, with a plain binary COPY pipe into a scratch
// table with the same columns and primary key.
func (b *bench) baseline(ctx context.Context, moves []MoveRow) ([]BaselineRun, error) {
	done := slices.DeleteFunc(slices.Clone(moves), func(m MoveRow) bool { return m.State != topo.MoveDone })
	if len(done) == 0 || *baselineN <= 0 {
		return nil, nil
	}
	n := min(*baselineN, len(done)) // spread over the moves done
	node := map[string]bucketmap.Node{}
	for _, n := range b.nodes {
		node[string(n.ID)] = n
	}
	say("copy baseline: plain COPY of %d moved buckets' ranges, source -> target, into app.kv_baseline", n)
	var runs []BaselineRun
	for i := range n {
		mv := done[i*len(done)/n]
		lo, hi, err := keystream.Range(*load.Level, mv.Bucket)
		if err != nil {
			return runs, err
		}
		run, _, err := copyPipeCols(ctx, node[mv.From], node[mv.To], lo, hi, "bkey, uid, v", false)
		if err != nil {
			return runs, err
		}
		run.Bucket, run.From, run.To = mv.Bucket, mv.From, mv.To
		say("  bucket %3d %s -> %s  %6d rows in %6.0f ms (%s rows/s); the mover: %6d rows in %6.0f ms (%s rows/s)",
			run.Bucket, run.From, run.To, run.Rows, run.MS, human(run.RowsPS), mv.Rows, mv.CopyMS, human(mv.RowsPS))
		runs = append(runs, run)
	}
	dropBaseline(ctx, node[done[0].To])
	return runs, nil
}

// dropBaseline drops the pipe's table from node n, as best it can.
func dropBaseline(ctx context.Context, n bucketmap.Node) {
	if c, err := dbnode.Connect(ctx, n); err == nil {
		_, _ = c.Exec(ctx, "DROP TABLE IF EXISTS app.kv_baseline")
		c.Close(context.Background())
	}
}

// copyPipeCols copies cols of the range from node from into
// app.kv_baseline (the table's columns, indexes and primary key, without
// its constraints) on node to through one binary COPY pipe: an io.Pipe, or
// batches of 64 KB, each node on a connection of its own. It returns the
// run and the bytes of the COPY stream.
func copyPipeCols(ctx context.Context, from, to bucketmap.Node, lo, hi int64, cols string, batched bool) (BaselineRun, int64, error) {
	var run BaselineRun
	src, err := dbnode.Connect(ctx, from)
	if err != nil {
		return run, 0, err
	}
	defer src.Close(context.Background())
	dst, err := dbnode.Connect(ctx, to)
	if err != nil {
		return run, 0, err
	}
	defer dst.Close(context.Background())
	if _, err := dst.Exec(ctx, "CREATE TABLE IF NOT EXISTS app.kv_baseline (LIKE app.kv INCLUDING ALL EXCLUDING CONSTRAINTS); TRUNCATE app.kv_baseline"); err != nil {
		return run, 0, err
	}
	pr, pw := io.Pipe()
	n := &counter{w: pw}
	var w io.Writer = n
	bw := bufio.NewWriterSize(n, 64<<10)
	if batched {
		w = bw
	}
	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := src.PgConn().CopyTo(ctx, w, fmt.Sprintf("COPY (SELECT %s FROM app.kv WHERE bkey BETWEEN %d AND %d) TO STDOUT (FORMAT binary)", cols, lo, hi))
		if err == nil {
			err = bw.Flush() // nothing to flush unless batched
		}
		pw.CloseWithError(err)
		errc <- err
	}()
	tag, err := dst.PgConn().CopyFrom(ctx, pr, fmt.Sprintf("COPY app.kv_baseline (%s) FROM STDIN (FORMAT binary)", cols))
	pr.CloseWithError(err)
	if serr := <-errc; serr != nil {
		return run, 0, fmt.Errorf("COPY TO: %w", serr)
	}
	if err != nil {
		return run, 0, fmt.Errorf("COPY FROM: %w", err)
	}
	el := time.Since(start)
	run.Rows, run.MS = tag.RowsAffected(), float64(el.Microseconds())/1000
	run.RowsPS = float64(run.Rows) / el.Seconds()
	return run, n.n, nil // the writer is done: errc said so
}

// counter counts the bytes written through it to w.
type counter struct {
	w io.Writer
	n int64
}

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.w.Write(p)
}
