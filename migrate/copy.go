package migrate

// The copy step's initial copy. PostgreSQL's own (a subscription with
// copy_data: one table-sync worker per table, a text-format COPY into the
// target through the apply machinery) copied a 2M-row bucket at about two
// thirds of the speed of a plain binary COPY pipe between the same nodes.
// The mover now copies the range itself:
//
//  1. it creates the move's logical slot on the source through a
//     replication connection, exporting the slot's snapshot: the rows as
//     of the slot's start, so that the changes the slot streams are
//     exactly those the snapshot does not have;
//  2. a few streams (copyStreams) each import that snapshot in a
//     REPEATABLE READ transaction on the source and copy a key sub-range of
//     the range with COPY (SELECT cols ... WHERE key BETWEEN a AND b ORDER
//     BY key) TO STDOUT (FORMAT binary), piped in 64 KB batches into COPY t
//     (cols) FROM STDIN (FORMAT binary) on the target, as
//     session_replication_role = replica (the target's fence refuses the
//     range's ordinary writers). Key order, when the source reads it
//     without a sort, spares the target inserts into its key index at
//     random places: most of the gain over a plain pipe of rows as stored;
//  3. once every stream has committed, the move enables its subscription
//     (created disabled, on that slot, without copy_data), whose apply
//     worker replays what changed since the snapshot.
//
// A target that refuses a row (a constraint only it has) fails that
// stream's COPY: the move aborts with the table, the row's primary key and
// PostgreSQL's error, found by applying the failing sub-range again in a
// transaction that is rolled back (reproduceApply).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/topo"
)

// CopyStreamsEnv, if set (1..8), is the number of parallel streams a move
// copies its range with, instead of DefaultCopyStreams.
const CopyStreamsEnv = "SHARDVISOR_MOVE_COPY_STREAMS"

// DefaultCopyStreams is how many streams copy a large range at once. The
// target's COPY is the bottleneck; a second stream uses the CPU a single
// one leaves idle. On the benchmark's 2-core machine (docs/moves.md,
// "Measured"), with a 2M-row bucket: in random key order one, two and
// three streams were within the noise of each other (1.08x to 1.32x the
// pipe); in key order two did clearly better (0.88x to 1.00x, against
// 0.52x for one and 0.78x for three).
const DefaultCopyStreams = 2

// copyRowsPerStream: a table whose range is estimated to hold fewer rows
// than this per stream is copied by fewer streams (each costs two
// connections and a snapshot import). A variable for tests.
var copyRowsPerStream = 20_000

// Failpoints in the copy step (see crashHook): every row committed on the
// target, its subscription still disabled; and the subscription enabled,
// the record still saying copy.
const (
	crashCopied      = "copied"
	crashCopyEnabled = "copy-enabled"
)

// copyTestHook, if set, runs once every stream holds the slot's snapshot,
// before any row is copied.
var copyTestHook func()

func copyStreams() int {
	if v, err := strconv.Atoi(os.Getenv(CopyStreamsEnv)); err == nil && v >= 1 && v <= 8 {
		return v
	}
	return DefaultCopyStreams
}

// restartCopy undoes what an earlier attempt at the copy left, so that a
// move resumed in copy starts its copy over: its subscription and slot
// (dropped together, so that no slot is ever left without the
// subscription that owns it: an abort's cleanup drops the slot through
// the subscription), a slot left alone, and the range's rows on the
// target. For a move that has just entered copy it finds nothing, in a few
// small queries.
func (r *run) restartCopy(ctx context.Context, src, dst *pgx.Conn) error {
	onSource, err := slotExists(ctx, src, r.rec.Slot)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	if onSource {
		// An enabled subscription's apply worker holds the slot: stop it
		// and its walsender, so that DROP SUBSCRIPTION can drop the slot.
		if err := disableSubscription(ctx, dst, r.rec.Subscription); err != nil {
			return fmt.Errorf("target: disabling the subscription of an earlier copy: %w", err)
		}
		if err := releaseSlot(ctx, src, r.rec.Slot); err != nil {
			return fmt.Errorf("source: %w", err)
		}
	}
	if err := dropSubscription(ctx, dst, r.rec.Subscription, onSource); err != nil {
		return fmt.Errorf("target: dropping the subscription of an earlier copy: %w", err)
	}
	if err := dropSlotNow(ctx, src, r.rec.Slot); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	n, err := clearRange(ctx, dst, r.rec.Tables, r.rec.Lo, r.rec.Hi)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if n > 0 {
		r.mv.log.Warn("copy started over: removed the rows an earlier attempt had copied to the target", zap.String("move", r.rec.ID), zap.Int64("rows", n))
	}
	return nil
}

// copyJob is one key sub-range of one table.
type copyJob struct {
	table  topo.TableRecord
	cols   string // the column list, quoted: every column but generated ones
	lo, hi int64
	est    float64 // the planner's estimate of its rows
}

// copyRange copies the range of every sharded table from the source to the
// target, from the snapshot of the move's slot, which it creates; it
// returns the rows copied. src and dst are the move's own connections
// (checked to reach the primaries the move began on).
func (r *run) copyRange(ctx context.Context, src, dst *pgx.Conn) (int64, error) {
	t0 := time.Now()
	schemas, err := fence.ReadSchemas(ctx, dst, r.rec.Tables)
	if err != nil {
		return 0, fmt.Errorf("target: %w", err)
	}
	streams := copyStreams()
	var jobs []copyJob
	for i, t := range r.rec.Tables {
		var cols []string
		for _, c := range schemas[i].Columns {
			if c.Generated == "" { // the target computes them
				cols = append(cols, ident(c.Name))
			}
		}
		est, err := estimateRows(ctx, src, t, r.rec.Lo, r.rec.Hi)
		if err != nil {
			r.mv.log.Warn("estimating the rows to copy", zap.String("move", r.rec.ID), zap.String("table", t.Name), zap.Error(err))
			est = float64(streams * copyRowsPerStream)
		}
		parts := min(streams, max(1, int(est/float64(copyRowsPerStream))))
		for _, sub := range splitRange(r.rec.Lo, r.rec.Hi, parts) {
			jobs = append(jobs, copyJob{table: t, cols: strings.Join(cols, ", "), lo: sub[0], hi: sub[1], est: est / float64(parts)})
		}
	}
	slices.SortStableFunc(jobs, func(a, b copyJob) int {
		switch {
		case a.est > b.est:
			return -1
		case a.est < b.est:
			return 1
		}
		return 0
	})
	n := min(streams, len(jobs))

	// The streams' connections are opened while the slot is created
	// (which waits for the source's running transactions anyway).
	sctx, cancel := context.WithCancel(ctx) // the streams'
	defer cancel()
	ss := make([]*copyStream, n)
	defer func() {
		for _, s := range ss {
			if s != nil {
				s.close()
			}
		}
	}()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss[i], errs[i] = r.openStream(sctx)
		}()
	}
	snapshot, rc, err := r.createSlot(ctx, src)
	slotAt := time.Now()
	wg.Wait()
	if rc != nil {
		defer func() {
			if rc != nil {
				rc.Close(context.WithoutCancel(ctx))
			}
		}()
	}
	if err != nil {
		return 0, err
	}
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	for _, s := range ss {
		if err := s.importSnapshot(sctx, snapshot); err != nil {
			return 0, err
		}
	}
	// Every stream holds the snapshot now: the replication connection may
	// go (the slot stays; nothing holds it until the subscription's apply
	// worker does).
	rc.Close(ctx)
	rc = nil
	readyAt := time.Now()
	r.slotTook = readyAt.Sub(t0)
	r.mv.log.Info("copying the range", zap.String("move", r.rec.ID), zap.Int("streams", n), zap.Int("parts", len(jobs)))
	if copyTestHook != nil {
		copyTestHook()
	}

	queue := make(chan copyJob, len(jobs))
	for _, j := range jobs {
		queue <- j
	}
	close(queue)
	var (
		copied   atomic.Int64 // rows, as they go through the pipes
		total    atomic.Int64 // rows committed on the target
		firstErr error
		errOnce  sync.Once
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		cancel()
	}
	done := make(chan struct{})
	for _, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range queue {
				if sctx.Err() != nil {
					return
				}
				rows, err := s.copy(sctx, j, &copied)
				if err != nil {
					fail(err)
					return
				}
				total.Add(rows)
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-tick.C:
			r.rec.Stats.RowsCopied = copied.Load()
			r.progress(fmt.Sprintf("copying: %d rows copied so far", copied.Load()))
		}
	}
	if firstErr == nil {
		if err := context.Cause(sctx); err != nil {
			firstErr = err
		}
	}
	if firstErr == nil {
		// Every part committed; the streams' transactions on the source
		// only read.
		r.progress(fmt.Sprintf("copied %d rows in %s: slot after %s, %d streams copying after %s, rows %s", total.Load(),
			time.Since(t0).Round(time.Millisecond), slotAt.Sub(t0).Round(time.Millisecond), n,
			readyAt.Sub(t0).Round(time.Millisecond), time.Since(readyAt).Round(time.Millisecond)))
		return total.Load(), nil
	}
	var refused *copyRefused
	if errors.As(firstErr, &refused) && ctx.Err() == nil {
		return 0, r.copyRefusal(ctx, src, dst, refused)
	}
	return 0, firstErr
}

// splitRange cuts lo..hi into parts key ranges of (nearly) equal width: a
// bucket's keys are keystream hashes, spread evenly over its range.
func splitRange(lo, hi int64, parts int) [][2]int64 {
	span := uint64(hi) - uint64(lo) // the range holds span+1 keys
	step := span/uint64(parts) + 1
	if span == ^uint64(0) {
		step = span / uint64(parts)
	}
	var out [][2]int64
	a := lo
	for i := range parts {
		b := int64(uint64(a) + step - 1)
		if i == parts-1 || uint64(b)-uint64(lo) >= span {
			out = append(out, [2]int64{a, hi})
			break
		}
		out = append(out, [2]int64{a, b})
		a = b + 1
	}
	return out
}

// estimateRows is the planner's estimate of the rows of t in lo..hi on c.
func estimateRows(ctx context.Context, c *pgx.Conn, t topo.TableRecord, lo, hi int64) (float64, error) {
	plan, err := explain(ctx, c, fmt.Sprintf("SELECT 1 FROM %s WHERE %s BETWEEN %d AND %d", ident(t.Name), ident(t.KeyColumn), lo, hi))
	if err != nil {
		return 0, err
	}
	return plan.Rows, nil
}

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan.
type planNode struct {
	Type  string     `json:"Node Type"`
	Rows  float64    `json:"Plan Rows"`
	Plans []planNode `json:"Plans"`
}

func (n planNode) sorts() bool {
	if strings.Contains(n.Type, "Sort") {
		return true
	}
	return slices.ContainsFunc(n.Plans, planNode.sorts)
}

func explain(ctx context.Context, c *pgx.Conn, query string) (planNode, error) {
	var plan string
	if err := c.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+query).Scan(&plan); err != nil {
		return planNode{}, err
	}
	var out []struct{ Plan planNode }
	if err := json.Unmarshal([]byte(plan), &out); err != nil || len(out) == 0 {
		return planNode{}, fmt.Errorf("reading the plan %q: %v", plan, err)
	}
	return out[0].Plan, nil
}

// selectJob is the query a job copies: in key order when the source reads
// the sub-range that way without a sort (an index scan of the key index
// the data contract asks for), so that the target inserts into its key
// index in order, which costs it markedly less than inserts at random
// places (and writes fewer full-page images after a checkpoint); as
// stored otherwise.
func selectJob(ctx context.Context, c *pgx.Conn, j copyJob) string {
	q := fmt.Sprintf("SELECT %s FROM %s WHERE %s BETWEEN %d AND %d", j.cols, ident(j.table.Name), ident(j.table.KeyColumn), j.lo, j.hi)
	ordered := q + " ORDER BY " + ident(j.table.KeyColumn)
	if plan, err := explain(ctx, c, ordered); err == nil && !plan.sorts() {
		return ordered
	}
	return q
}

// replicationConn opens a logical replication connection to the node's
// primary (a group's DSN lists every member and asks for a read-write
// server, as the subscription's does).
func replicationConn(ctx context.Context, n bucketmap.Node) (*pgconn.PgConn, error) {
	cfg, err := dbnode.ConnConfig(n)
	if err != nil {
		return nil, err
	}
	pc := cfg.Config.Copy()
	pc.RuntimeParams["replication"] = "database"
	c, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("db node %s: replication connection: %w", n.ID, err)
	}
	return c, nil
}

// createSlot creates the move's logical slot (for pgoutput) on the
// source, through a replication connection, and returns the name of the
// snapshot it exports, with that connection: the snapshot is valid until
// the connection runs another command or closes. Creating a slot waits for
// the transactions running on the source to end.
func (r *run) createSlot(ctx context.Context, src *pgx.Conn) (string, *pgconn.PgConn, error) {
	rc, err := replicationConn(ctx, r.src)
	if err != nil {
		return "", nil, fmt.Errorf("source: %w", err)
	}
	res, err := rc.Exec(ctx, fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT 'export')", ident(r.rec.Slot))).ReadAll()
	if err == nil && (len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) < 3 || len(res[0].Rows[0][2]) == 0) {
		err = errors.New("CREATE_REPLICATION_SLOT returned no snapshot")
	}
	if err != nil {
		return "", rc, fmt.Errorf("source: creating replication slot %s: %w", r.rec.Slot, err)
	}
	// A group's DSN lists every member: the slot must be on the primary
	// the move's own connection reaches.
	if ok, err := slotExists(ctx, src, r.rec.Slot); err != nil {
		return "", rc, fmt.Errorf("source: %w", err)
	} else if !ok {
		return "", rc, fmt.Errorf("%w: the source %s's replication connection reached another server than the move's", ErrFailover, r.rec.Source)
	}
	return string(res[0].Rows[0][2]), rc, nil
}

// copyStream is one source transaction on the slot's snapshot and one
// target session that writes as replication does.
type copyStream struct {
	src, dst *pgx.Conn
}

func (r *run) openStream(ctx context.Context) (*copyStream, error) {
	s := &copyStream{}
	var err error
	if s.src, err = dbnode.Connect(ctx, r.src); err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	if s.dst, err = dbnode.Connect(ctx, r.dst); err != nil {
		s.close()
		return nil, fmt.Errorf("target: %w", err)
	}
	if err := r.sameServer(ctx, s.dst, "target"); err != nil {
		s.close()
		return nil, fmt.Errorf("target: %w", err)
	}
	if _, err := s.dst.Exec(ctx, "SET session_replication_role = replica"); err != nil {
		s.close()
		return nil, fmt.Errorf("target: %w", err)
	}
	return s, nil
}

// importSnapshot starts the stream's source transaction on the slot's
// snapshot (which only a connection to the same server can import).
func (s *copyStream) importSnapshot(ctx context.Context, snapshot string) error {
	for _, q := range []string{"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "SET TRANSACTION SNAPSHOT " + literal(snapshot)} {
		if _, err := s.src.Exec(ctx, q); err != nil {
			return fmt.Errorf("source: importing the slot's snapshot: %w", err)
		}
	}
	return nil
}

func (s *copyStream) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if s.src != nil {
		s.src.Close(ctx)
	}
	if s.dst != nil {
		s.dst.Close(ctx)
	}
}

// copy pipes one job from the source to the target and returns the rows
// the target committed.
func (s *copyStream) copy(ctx context.Context, j copyJob, copied *atomic.Int64) (int64, error) {
	out := "COPY (" + selectJob(ctx, s.src, j) + ") TO STDOUT (FORMAT binary)"
	in := fmt.Sprintf("COPY %s (%s) FROM STDIN (FORMAT binary)", ident(j.table.Name), j.cols)
	p := newChunkPipe(copied)
	srcErr := make(chan error, 1)
	go func() {
		_, err := s.src.PgConn().CopyTo(ctx, p, out)
		p.closeWrite(err)
		srcErr <- err
	}()
	tag, err := s.dst.PgConn().CopyFrom(ctx, p, in)
	p.closeRead()
	if serr := <-srcErr; serr != nil && !errors.Is(serr, errPipeReader) {
		return 0, fmt.Errorf("source: copying %s: %w", j.table.Name, serr)
	}
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && ctx.Err() == nil {
			return 0, &copyRefused{job: j, err: pe}
		}
		return 0, fmt.Errorf("target: copying %s: %w", j.table.Name, err)
	}
	// Each Write is a row, but the last one (the trailer).
	copied.Add(tag.RowsAffected() - p.writes)
	return tag.RowsAffected(), nil
}

// copyRefused: the target refused a part's COPY.
type copyRefused struct {
	job copyJob
	err *pgconn.PgError
}

func (e *copyRefused) Error() string {
	return fmt.Sprintf("target: copying %s (keys %d..%d): %s", e.job.table.Name, e.job.lo, e.job.hi, pgError(e.err))
}

// copyRefusal turns a refused COPY into the move's error: the table, the
// row by its primary key, and PostgreSQL's error. COPY names the row only
// by its position in the stream, so the part's rows are applied again, as
// replication would, in a transaction that is rolled back.
func (r *run) copyRefusal(ctx context.Context, src, dst *pgx.Conn, e *copyRefused) error {
	detail, err := reproduceApply(ctx, src, dst, []topo.TableRecord{e.job.table}, e.job.lo, e.job.hi)
	if err != nil || !strings.HasPrefix(detail, "table "+e.job.table.Name+", row ") {
		if err != nil {
			detail = err.Error()
		}
		where := ""
		if e.err.Where != "" {
			where = " (" + e.err.Where + ")"
		}
		detail = fmt.Sprintf("table %s, keys %d..%d: %s%s; applying those rows again: %s", e.job.table.Name, e.job.lo, e.job.hi, pgError(e.err), where, detail)
	}
	r.mv.log.Error("the target refused a row of the initial copy", zap.String("move", r.rec.ID), zap.String("detail", detail))
	return fmt.Errorf("target %s refused a row of the source during the initial copy: %s", r.rec.Target, detail)
}

// errPipeReader: the COPY FROM reading a chunkPipe ended first.
var errPipeReader = errors.New("the target's COPY ended")

// chunkPipeSize is how much of a COPY TO's output goes to the COPY FROM at
// once. pgconn hands a CopyTo's writer one row per Write, and its CopyFrom
// sends what each Read returns as one message: through an io.Pipe, that is
// a message and a system call per row on each side.
const chunkPipeSize = 64 << 10

// chunkPipe connects a CopyTo (the writer) to a CopyFrom (the reader) in
// chunks of about chunkPipeSize, with a few chunks in flight.
type chunkPipe struct {
	full   chan []byte
	free   chan []byte
	stop   chan struct{}
	once   sync.Once
	cur    []byte // the writer's
	buf    []byte // the reader's chunk,
	rest   []byte // and what it has not read of it
	werr   error  // set by closeWrite before full is closed
	writes int64
	rows   *atomic.Int64
}

func newChunkPipe(rows *atomic.Int64) *chunkPipe {
	return &chunkPipe{full: make(chan []byte, 4), free: make(chan []byte, 6), stop: make(chan struct{}), rows: rows}
}

func (p *chunkPipe) Write(b []byte) (int, error) {
	if p.cur == nil {
		select {
		case p.cur = <-p.free:
		default:
			p.cur = make([]byte, 0, chunkPipeSize+16<<10)
		}
	}
	p.cur = append(p.cur, b...)
	p.writes++
	p.rows.Add(1)
	if len(p.cur) >= chunkPipeSize {
		if err := p.flush(); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

func (p *chunkPipe) flush() error {
	select {
	case p.full <- p.cur:
		p.cur = nil
		return nil
	case <-p.stop:
		return errPipeReader
	}
}

// closeWrite ends the stream: the reader gets the rest and then io.EOF,
// or err.
func (p *chunkPipe) closeWrite(err error) {
	if err == nil && len(p.cur) > 0 {
		err = p.flush()
	}
	p.werr = err
	close(p.full)
}

func (p *chunkPipe) Read(b []byte) (int, error) {
	if len(p.rest) == 0 {
		if p.buf != nil {
			select {
			case p.free <- p.buf[:0]:
			default:
			}
			p.buf = nil
		}
		c, ok := <-p.full
		if !ok {
			if p.werr != nil {
				return 0, p.werr
			}
			return 0, io.EOF
		}
		p.buf, p.rest = c, c
	}
	n := copy(b, p.rest)
	p.rest = p.rest[n:]
	return n, nil
}

// closeRead tells the writer that nothing reads any more.
func (p *chunkPipe) closeRead() { p.once.Do(func() { close(p.stop) }) }
