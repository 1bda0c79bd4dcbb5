package main

// The big-bucket mode (--big-rows N, issue 23 item 7): one bucket of N rows,
// some of them with a TOASTed value, moved once to the fourth node, and the
// same rows copied through a single binary COPY pipe between the same two
// nodes in the same run, before and after the move. No write load: the
// figure is the copy's speed against the pipe's.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/topo"
)

// blobDDL is the big mode's extra column: NULL but in every Nth row.
const blobDDL = `ALTER TABLE app.kv ADD COLUMN IF NOT EXISTS blob bytea`

// BigRun is the big-bucket mode's figures.
type BigRun struct {
	Bucket      uint32  `json:"bucket"`
	From        string  `json:"from"`
	To          string  `json:"to"`
	Rows        int64   `json:"rows"`           // the bucket's rows on the source
	Toasted     int64   `json:"toasted_values"` // of them, with a 4 KB value
	MB          float64 `json:"copy_mb"`        // the binary COPY stream of those rows, in MB (10^6 bytes)
	LoadSeconds float64 `json:"load_seconds"`
	Streams     int     `json:"copy_streams"`
	MoveState   string  `json:"move_state"`
	MoveID      string  `json:"move_id"`
	RowsCopied  int64   `json:"rows_copied"`
	CopyS       float64 `json:"copy_s"` // the move record's copy time
	PauseMS     float64 `json:"pause_ms"`
	MoveTotalS  float64 `json:"move_total_s"`
	VerifyOK    bool    `json:"verify_ok"`
	VerifyS     float64 `json:"verify_s"`     // the move's verify step
	VerifyShare float64 `json:"verify_share"` // of the move's wall time (issue 25's goal: at most 0.25)
	// The check alone, both nodes at once over the moved range, with the
	// row hash moves use (hash_record_extended) and the one they used
	// before (JSON + md5): the same job, the same rows.
	CheckHashS   float64   `json:"check_hash_s"`
	CheckJSONS   float64   `json:"check_json_s"`
	CheckRatio   float64   `json:"check_ratio"`    // JSON / hash: above 1 the hash is faster
	PipeS        []float64 `json:"pipe_s"`         // single binary COPY pipe (io.Pipe), before and after the move
	PipeMeanS    float64   `json:"pipe_mean_s"`    // their mean
	Ratio        float64   `json:"ratio"`          // pipe mean / copy: above 1 the move's copy is faster
	BatchedPipeS float64   `json:"batched_pipe_s"` // the same single pipe, in 64 KB batches (for information)
	BatchedRatio float64   `json:"batched_ratio"`
}

// runBig is the big-bucket mode, after setup.
func (b *bench) runBig(ctx context.Context, sum *Summary) error {
	big := &BigRun{Streams: migrate.DefaultCopyStreams}
	sum.Big = big
	if n, err := strconv.Atoi(os.Getenv(migrate.CopyStreamsEnv)); err == nil && n > 0 {
		big.Streams = n
	}
	m, _, err := b.st.Load(ctx)
	if err != nil {
		return err
	}
	big.Bucket = uint32(max(slices.Index(m.OwnerIndexes(), 0), 0)) // pg1's first (slot = bucket at the map's level)
	src, dst := b.nodes[0], b.nodes[startNodes]
	big.From, big.To = string(src.ID), string(dst.ID)
	lo, hi, err := keystream.Range(*load.Level, big.Bucket)
	if err != nil {
		return err
	}

	// Every other bucket gets a few rows (the source's table is not the
	// bucket alone), then the big bucket its rows, in random key order as
	// users' rows arrive, straight into the owner.
	*rowsPerBucket = *bigOthers
	loadStart := time.Now()
	n, _, err := b.load(ctx)
	if err != nil {
		return err
	}
	sum.RowsLoaded = n
	say("loading bucket %d on %s: %s rows, every %dth with a 4 KB value", big.Bucket, src.ID, human(float64(*bigRows)), *bigToastEvery)
	c, err := dbnode.Connect(ctx, src)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	// Keys spread evenly over the bucket's range, in random order (in key
	// order with --big-sorted); past the fence, as replication writes.
	if _, err := c.Exec(ctx, fmt.Sprintf(`SET session_replication_role = replica; INSERT INTO app.kv (bkey, uid, v, blob)
		SELECT %d + (random() * %d::numeric)::bigint, 'big' || i, i,
			CASE WHEN i %% %d = 0 THEN (SELECT decode(string_agg(md5(i::text || '/' || j::text), ''), 'hex') FROM generate_series(1, 256) j) END
		FROM generate_series(1, %d) i %s`, lo, uint64(hi)-uint64(lo), *bigToastEvery, *bigRows, map[bool]string{true: "ORDER BY 1"}[*bigSorted])); err != nil {
		return fmt.Errorf("loading the big bucket: %w", err)
	}
	if _, err := c.Exec(ctx, "VACUUM (ANALYZE) app.kv"); err != nil {
		return err
	}
	if err := c.QueryRow(ctx, "SELECT count(*), count(blob) FROM app.kv WHERE bkey BETWEEN $1 AND $2", lo, hi).Scan(&big.Rows, &big.Toasted); err != nil {
		return err
	}
	sum.RowsLoaded += int64(*bigRows)
	big.LoadSeconds = time.Since(loadStart).Seconds()
	sum.LoadSeconds = big.LoadSeconds

	if _, err := clustertest.AddNode(ctx, b.st, b.nodes[startNodes]); err != nil {
		return err
	}

	// pipe times the pipe into PipeS, or BatchedPipeS.
	pipe := func(batched bool) error {
		if err := checkpoint(ctx, src, dst); err != nil {
			return fmt.Errorf("pipe: %w", err)
		}
		run, bytes, err := copyPipeCols(ctx, src, dst, lo, hi, "bkey, uid, v, blob", batched)
		if err == nil && run.Rows != big.Rows {
			err = fmt.Errorf("the pipe copied %d rows of %d", run.Rows, big.Rows)
		}
		if err != nil {
			return fmt.Errorf("pipe: %w", err)
		}
		big.MB = float64(bytes) / 1e6
		if batched {
			big.BatchedPipeS = run.MS / 1000
		} else {
			big.PipeS = append(big.PipeS, run.MS/1000)
		}
		return nil
	}
	say("pipe before the move (%s -> %s, into app.kv_baseline)", src.ID, dst.ID)
	if err := pipe(false); err != nil {
		return err
	}

	say("moving bucket %d %s -> %s (%d copy streams)", big.Bucket, src.ID, dst.ID, big.Streams)
	if err := checkpoint(ctx, src, dst); err != nil {
		return err
	}
	mv := migrate.New(b.st, migrate.Options{Progress: func(prog migrate.Progress) {
		if prog.Message == topo.MoveDone || strings.HasPrefix(prog.Message, "cop") {
			say("  %s", prog.Message)
		}
	}})
	defer mv.Close()
	rec, merr := mv.Move(ctx, big.Bucket, dst.ID, false)
	if rec != nil {
		row := b.moveRow(rec)
		sum.Moves = append(sum.Moves, row)
		big.MoveID, big.MoveState, big.RowsCopied, big.VerifyOK = row.ID, row.State, row.Rows, row.VerifyOK
		big.CopyS, big.PauseMS, big.MoveTotalS, big.VerifyS = row.CopyMS/1000, row.PauseMS, row.TotalMS/1000, row.VerifyMS/1000
		if big.MoveTotalS > 0 {
			big.VerifyShare = big.VerifyS / big.MoveTotalS
		}
	}
	if merr != nil {
		return fmt.Errorf("the move: %w", merr)
	}

	say("the range's check alone, both nodes at once: hash, then JSON + md5")
	if big.CheckHashS, err = checkBoth(ctx, src, dst, lo, hi, `hashint8extended(hash_record_extended(ROW(t.blob, t.bkey, t.uid COLLATE "C", t.v), 1), 0)`); err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if big.CheckJSONS, err = checkBoth(ctx, src, dst, lo, hi, `('x' || substr(md5(to_jsonb(t)::text), 1, 15))::bit(60)::bigint::numeric`); err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if big.CheckHashS > 0 {
		big.CheckRatio = big.CheckJSONS / big.CheckHashS
	}

	say("pipe after the move")
	if err := pipe(false); err != nil {
		return err
	}
	if err := pipe(true); err != nil {
		return err
	}
	dropBaseline(ctx, dst)
	big.PipeMeanS = (big.PipeS[0] + big.PipeS[1]) / 2
	if big.CopyS > 0 {
		big.Ratio, big.BatchedRatio = big.PipeMeanS/big.CopyS, big.BatchedPipeS/big.CopyS
	}
	sum.Leftovers = b.leftovers(ctx)
	return nil
}

func reportBig(s *Summary) {
	g := s.Big
	say("\nbig-bucket move benchmark (issue 23): bucket %d, %s -> %s, %d cores", g.Bucket, g.From, g.To, s.Cores)
	say("  rows:   %d in the bucket (%d with a 4 KB TOASTed value), %.0f MB as binary COPY; %s rows in the source's other buckets", g.Rows, g.Toasted, g.MB, human(float64(s.RowsLoaded-int64(g.Rows))))
	say("  move:   %s, %d rows copied with %d streams, verified: %v, write pause %.1f ms, %.1f s in all", g.MoveState, g.RowsCopied, g.Streams, g.VerifyOK, g.PauseMS, g.MoveTotalS)
	pipes := make([]string, len(g.PipeS))
	for i, p := range g.PipeS {
		pipes[i] = fmt.Sprintf("%.2f s", p)
	}
	say("  pipe:   single binary COPY (SELECT ... range) TO STDOUT | COPY ... FROM STDIN, before and after the move: %s", strings.Join(pipes, ", "))
	say("  copy %.2f s vs pipe %.2f s: %.2f×", g.CopyS, g.PipeMeanS, g.Ratio)
	say("  verification %.2f s of the move's %.2f s: %.0f%% (issue 25's goal: at most 25%%)", g.VerifyS, g.MoveTotalS, 100*g.VerifyShare)
	say("  the check alone, both nodes at once: JSON + md5 %.2f s vs the row hash moves use %.2f s: %.2f×", g.CheckJSONS, g.CheckHashS, g.CheckRatio)
	say("  (the same pipe in 64 KB batches: %.2f s: %.2f×)", g.BatchedPipeS, g.BatchedRatio)
	reportEnd(s)
}

// checkpoint runs CHECKPOINT on both nodes, so that a timed copy does not
// pay for the previous one's dirty pages.
func checkpoint(ctx context.Context, nodes ...bucketmap.Node) error {
	return clustertest.EachNode(ctx, nodes, func(_ int, _ bucketmap.Node, c *pgx.Conn) error {
		if _, err := c.Exec(ctx, "CHECKPOINT"); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		return nil
	})
}

// checkBoth counts and sums the range on both nodes at once with a row
// hash expression, as a move's verification does when the copies agree
// (one aggregate; chunks only for a table whose totals differ), and
// returns the wall time.
func checkBoth(ctx context.Context, a, b bucketmap.Node, lo, hi int64, hash string) (float64, error) {
	q := fmt.Sprintf(`SELECT count(*), coalesce(sum(%s), 0)::text FROM app.kv t WHERE bkey BETWEEN $1 AND $2`, hash)
	start := time.Now()
	err := clustertest.EachNode(ctx, []bucketmap.Node{a, b}, func(_ int, _ bucketmap.Node, c *pgx.Conn) error {
		var n int64
		var sum string
		return c.QueryRow(ctx, q, lo, hi).Scan(&n, &sum)
	})
	return time.Since(start).Seconds(), err
}
