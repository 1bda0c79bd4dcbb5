package backup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Restoring one bucket into the live cluster:
//
//  1. where its keys lived: the map kept with the restore point names the
//     owner, at the point, of each part of the bucket's key range (the
//     bucket may have been split or moved since); the current map names
//     where each part lives now;
//  2. recover: each owner at the point is recovered from its backups to
//     the point into a scratch server (scratch.go);
//  3. stage: the range's rows of each sharded table are copied from the
//     scratch servers into unlogged staging tables on the current owners
//     (binary COPY, as a move's copy), outside any pause;
//  4. diff: by primary key, the rows that come back (gone now), change
//     (differ now) and go (exist now, not at the point); a dry run stops
//     here;
//  5. apply, twice on each current owner, in one transaction each:
//     first without holding anyone back (most of the work, which a write
//     to the bucket meanwhile may partly undo), then as the pause: the
//     transaction takes the fence's drain locks of the range's granules
//     exclusively (the fence's trigger takes them shared in every write
//     to a sharded table), so that writers to this bucket wait and nobody
//     else does, re-checks that the node owns the range, and applies what
//     differs still. Its commit ends the pause. The fence's metadata is
//     read FOR SHARE in it, so no flip of the node's fence commits
//     meanwhile. A crash anywhere leaves no frozen range: the pause is a
//     transaction, rolled back if its connection dies.
//
// The restore writes as session_replication_role = replica: the
// application's triggers and the fence's do not fire (it holds the
// drain locks and checked ownership itself).

// Modes.
const (
	// ModeReplace makes the bucket's rows exactly what they were at the
	// point: rows come back, change back, and rows made since go.
	ModeReplace = topo.RestoreModeFull
	// ModeMissing only adds back the rows that are gone.
	ModeMissing = topo.RestoreModeMiss
)

// RestoreOptions are a bucket restore's.
type RestoreOptions struct {
	// Bucket as operators name it (NUMBER or PREFIX/DEPTH), in the current
	// map or, if it was split or merged since, in the point's; or User: one
	// user's rows only (their bucket key, keystream.Key, which every row
	// of theirs carries), inside their bucket. One of the two.
	Bucket string
	User   string
	// Point names a restore point; or Time: the newest point at or before
	// it gives the map, and the servers are recovered to Time.
	Point string
	Time  time.Time
	Mode  string
	// Tables limits the restore to these sharded tables ("schema.table").
	Tables []string
	DryRun bool
	// PGBackRest runs pgBackRest; ScratchDir is where scratch servers go
	// (default: the system's temporary directory); PGBin holds pg_ctl.
	PGBackRest PGBackRest
	ScratchDir string
	PGBin      string
	// LockTimeout bounds the pause's wait for writers already in the
	// bucket (default 2 s); the pause is tried 3 times.
	LockTimeout time.Duration
	// Samples is how many primary keys of each kind a result shows
	// (default 5).
	Samples  int
	By       string
	Logger   *zap.Logger
	Progress func(string)
}

// RestoreResult says what a bucket restore did (or, dry, would do).
type RestoreResult struct {
	ID     string `json:"id"`
	Bucket string `json:"bucket"`
	// User: only this user's rows were restored (Lo = Hi, their key).
	User  string `json:"user,omitempty"`
	Lo    int64  `json:"lo"`
	Hi    int64  `json:"hi"`
	Point string `json:"point"`
	// Target is what the servers were recovered to.
	Target     string        `json:"target"`
	Mode       string        `json:"mode"`
	DryRun     bool          `json:"dry_run"`
	MapVersion uint64        `json:"map_version"`
	Pieces     []Piece       `json:"pieces"`
	Tables     []TableResult `json:"tables"`
	// Times: recovery of the scratch servers, the staging copy, the diff,
	// and the pause (the longest of any node's apply transaction), in
	// milliseconds; WaitedMS is the pause with the attempts before it
	// that gave up waiting for the bucket's writers (they waited then
	// too).
	RecoverMS float64 `json:"recover_ms"`
	StageMS   float64 `json:"stage_ms"`
	DiffMS    float64 `json:"diff_ms"`
	PauseMS   float64 `json:"pause_ms"`
	WaitedMS  float64 `json:"waited_ms"`
	TotalMS   float64 `json:"total_ms"`
	// Staged counts the rows copied from the point.
	Staged int64 `json:"staged_rows"`
}

// Piece is one part of the bucket's key range: where it lived at the point
// and where it lives now.
type Piece struct {
	Lo   int64  `json:"lo"`
	Hi   int64  `json:"hi"`
	From string `json:"from"`
	To   string `json:"to"`
}

// TableResult is one table's part of a restore.
type TableResult struct {
	Table string `json:"table"`
	// Back: rows at the point that are gone now; Changed: rows that
	// differ; Gone: rows now that were not there at the point (replace
	// removes them; missing keeps them).
	Back    int64 `json:"back"`
	Changed int64 `json:"changed"`
	Gone    int64 `json:"gone"`
	// Samples of each, as primary keys (row text).
	BackKeys    []string `json:"back_keys,omitempty"`
	ChangedKeys []string `json:"changed_keys,omitempty"`
	GoneKeys    []string `json:"gone_keys,omitempty"`
	// Skipped says why the table was not restored.
	Skipped string `json:"skipped,omitempty"`
}

// ErrBucketBusy means a part of the bucket is moving now.
var ErrBucketBusy = errors.New("the bucket is moving")

// RestoreBucket restores one bucket to a restore point or a time.
func RestoreBucket(ctx context.Context, st *bucketmap.Store, opt RestoreOptions) (*RestoreResult, error) {
	start := time.Now()
	if opt.Mode == "" {
		opt.Mode = ModeReplace
	}
	if opt.Mode != ModeReplace && opt.Mode != ModeMissing {
		return nil, fmt.Errorf("restore: mode %q is not %q or %q", opt.Mode, ModeReplace, ModeMissing)
	}
	if (opt.Bucket == "") == (opt.User == "") {
		return nil, errors.New("restore: name a bucket or a user (one of them)")
	}
	if (opt.Point == "") == opt.Time.IsZero() {
		return nil, errors.New("restore: name a restore point or a time (one of them)")
	}
	if opt.LockTimeout <= 0 {
		opt.LockTimeout = 2 * time.Second
	}
	if opt.Samples <= 0 {
		opt.Samples = 5
	}
	if opt.ScratchDir == "" {
		opt.ScratchDir = filepath.Join(os.TempDir(), "shardvisor-restore")
	}
	log := opt.Logger
	if log == nil {
		log = zap.NewNop()
	}
	say := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		log.Info("restore: " + msg)
		if opt.Progress != nil {
			opt.Progress(msg)
		}
	}
	s, p := st.Session(), st.Paths()
	cur, _, err := st.Load(ctx)
	if err != nil {
		return nil, err
	}
	rp, target, err := resolvePoint(ctx, s, p, opt)
	if err != nil {
		return nil, err
	}
	pmData, err := topo.ReadRestorePointMap(ctx, s, p, rp.Name)
	if err != nil {
		return nil, fmt.Errorf("restore point %s: its map: %w", rp.Name, err)
	}
	pm, err := bucketmap.Decode(p.RestorePointMap(rp.Name), pmData)
	if err != nil {
		return nil, err
	}
	rec, err := topo.ReadCluster(ctx, s, p)
	if err != nil {
		return nil, err
	}
	var userKey *int64
	if opt.User != "" {
		seed, err := keystream.ParseSeed(rec.Seed)
		if err != nil {
			return nil, err
		}
		ks, err := keystream.New(seed)
		if err != nil {
			return nil, err
		}
		k := keystream.Key(ks.Prefix64(opt.User))
		userKey = &k
		opt.Bucket = cur.BucketOfPrefix(ks.Prefix64(opt.User)).String()
	}
	if pb, err := bucketmap.ParseBucket(opt.Bucket); err == nil && pb.Depth == bucketmap.AtLevel && pm.Level != cur.Level {
		return nil, hint.New(fmt.Errorf("restore: bucket %s: the map's level is %d now and was %d at restore point %s, so a bare number is ambiguous: name the bucket as NUMBER/DEPTH", opt.Bucket, cur.Level, pm.Level, rp.Name),
			"shardctl buckets lists today's; shardctl route UID names a user's")
	}
	b, err := cur.ParseBucket(opt.Bucket)
	if err != nil {
		if b2, err2 := pm.ParseBucket(opt.Bucket); err2 == nil {
			b = b2 // a bucket of the point's map, split or merged since
		} else {
			return nil, err
		}
	}
	lo, hi := b.Keys()
	if userKey != nil {
		lo, hi = *userKey, *userKey
	}
	pieces, err := planPieces(pm, cur, lo, hi)
	if err != nil {
		return nil, err
	}
	if !opt.Time.IsZero() {
		if err := sameOwnersSince(ctx, s, p, cur, rp, lo, hi, opt.Time); err != nil {
			return nil, err
		}
	}
	tables, err := chooseTables(rec.Tables, opt.Tables)
	if err != nil {
		return nil, err
	}
	id := newRestoreID()
	res := &RestoreResult{ID: id, Bucket: b.String(), User: opt.User, Lo: lo, Hi: hi, Point: rp.Name, Target: target.String(), Mode: opt.Mode, DryRun: opt.DryRun, MapVersion: cur.Version, Pieces: pieces}
	r := &topo.BucketRestore{ID: id, Bucket: b.String(), User: opt.User, Lo: lo, Hi: hi, Mode: opt.Mode, Point: rp.Name, Time: opt.Time, DryRun: opt.DryRun, Tables: opt.Tables, State: topo.RestorePlanned, By: opt.By, At: time.Now().UTC()}
	save := func(state string, err error) {
		r.State = state
		if err != nil {
			r.Error = hint.Text(err)
		}
		if werr := topo.WriteBucketRestore(context.WithoutCancel(ctx), s, p, r); werr != nil {
			log.Warn("restore: writing its record", zap.Error(werr))
		}
	}
	save(topo.RestorePlanned, nil)
	fail := func(err error) (*RestoreResult, error) {
		save(topo.RestoreFailed, err)
		return nil, err
	}
	if opt.User != "" {
		say("user %s's rows (key %d, in bucket %s) to %s, mode %s", opt.User, lo, b, target, opt.Mode)
	} else {
		say("bucket %s (keys %d..%d) to %s, mode %s: %d part(s)", b, lo, hi, target, opt.Mode, len(pieces))
	}

	// Recover each owner at the point into a scratch server.
	save(topo.RestoreRecover, nil)
	cfg, _, err := topo.ReadBackupConfig(ctx, s, p)
	if err != nil {
		return fail(err)
	}
	scratch := map[string]*Scratch{}
	defer func() {
		for _, sc := range scratch {
			sc.Close()
		}
	}()
	recovering := time.Now()
	for _, pc := range pieces {
		if scratch[pc.From] != nil {
			continue
		}
		n, ok := pm.Node(bucketmap.NodeID(pc.From))
		if !ok {
			return fail(fmt.Errorf("restore point %s: its map has no node %s", rp.Name, pc.From))
		}
		stanza := rp.Nodes[pc.From].Stanza
		if stanza == "" {
			stanza = cfg.Stanzas[pc.From]
		}
		if stanza == "" {
			return fail(hint.New(fmt.Errorf("node %s has no pgBackRest stanza", pc.From), "shardctl backup configure "+pc.From+" --stanza NAME"))
		}
		db, err := databaseOf(n)
		if err != nil {
			return fail(err)
		}
		// Recovery ends where the archive ends: the WAL up to the target
		// must be in it. A point's segment usually is (CreatePoint waited
		// for it); a time just past is in a segment still being written.
		if live, ok := cur.Node(bucketmap.NodeID(pc.From)); ok && (target.Name == "" || !rp.Nodes[pc.From].Archived) {
			if err := archiveUpToNow(ctx, live); err != nil {
				return fail(hint.New(fmt.Errorf("node %s: the WAL up to %s is not archived: %w", pc.From, target, err), "shardctl backup list "+pc.From+" says whether its archiving fails"))
			}
		}
		say("recovering node %s (stanza %s, database %s) to %s into a scratch server", pc.From, stanza, db, target)
		nodeTarget := target
		if nodeTarget.Name != "" {
			nodeTarget.LSN = rp.Nodes[pc.From].LSN
		}
		sc, err := opt.PGBackRest.RecoverScratch(ctx, opt.ScratchDir, opt.PGBin, pc.From, stanza, db, nodeTarget)
		if err != nil {
			return fail(err)
		}
		scratch[pc.From] = sc
		r.Scratch = append(r.Scratch, sc.Dir)
		save(topo.RestoreRecover, nil)
		say("node %s recovered in %s", pc.From, sc.Recovered.Round(time.Millisecond))
	}
	res.RecoverMS = ms(time.Since(recovering))

	// Stage, diff and apply on each current owner.
	save(topo.RestoreStage, nil)
	byTo := map[string][]Piece{}
	var owners []string
	for _, pc := range pieces {
		if byTo[pc.To] == nil {
			owners = append(owners, pc.To)
		}
		byTo[pc.To] = append(byTo[pc.To], pc)
	}
	sort.Strings(owners)
	results := map[string]*TableResult{}
	for _, t := range tables {
		results[t.Name] = &TableResult{Table: t.Name}
	}
	// Every owner stages and diffs before any applies: a failure there
	// (a table that cannot be matched, a type changed since) changes
	// nothing anywhere.
	var work []*ownerWork
	defer func() {
		for _, w := range work {
			w.close(ctx)
		}
	}()
	for _, to := range owners {
		n, ok := cur.Node(bucketmap.NodeID(to))
		if !ok {
			return fail(fmt.Errorf("the map has no node %s", to))
		}
		w, err := prepareOn(ctx, n, byTo[to], tables, scratch, id, opt, say)
		if w != nil {
			work = append(work, w)
		}
		if err != nil {
			return fail(fmt.Errorf("node %s: %w", to, err))
		}
	}
	if !opt.DryRun {
		save(topo.RestoreApply, nil)
		var applied []string
		for _, w := range work {
			if err := w.apply(ctx, opt, say); err != nil {
				if len(applied) > 0 {
					err = hint.New(fmt.Errorf("%w (applied on %s already: restore the rest alone, naming the buckets of %s)", err, strings.Join(applied, ", "), w.node.ID),
						"shardctl buckets lists the buckets of the range now; shardctl restore PREFIX/DEPTH --to ...")
				}
				r.Result = map[string]any{"applied_on": applied}
				return fail(fmt.Errorf("node %s: %w", w.node.ID, err))
			}
			applied = append(applied, string(w.node.ID))
		}
	}
	for _, w := range work {
		nr := w.nr
		for _, tr := range nr.tables {
			agg := results[tr.Table]
			if tr.Skipped != "" {
				agg.Skipped = tr.Skipped
				continue
			}
			agg.Back += tr.Back
			agg.Changed += tr.Changed
			agg.Gone += tr.Gone
			agg.BackKeys = appendMax(agg.BackKeys, tr.BackKeys, opt.Samples)
			agg.ChangedKeys = appendMax(agg.ChangedKeys, tr.ChangedKeys, opt.Samples)
			agg.GoneKeys = appendMax(agg.GoneKeys, tr.GoneKeys, opt.Samples)
		}
		res.Staged += nr.staged
		res.StageMS += nr.stageMS
		res.DiffMS += nr.diffMS
		res.PauseMS = max(res.PauseMS, nr.pauseMS)
		res.WaitedMS = max(res.WaitedMS, nr.waitedMS)
	}
	for _, t := range tables {
		res.Tables = append(res.Tables, *results[t.Name])
	}
	res.TotalMS = ms(time.Since(start))
	r.Result = map[string]any{"staged_rows": res.Staged, "pause_ms": res.PauseMS, "recover_ms": res.RecoverMS, "stage_ms": res.StageMS, "total_ms": res.TotalMS}
	if opt.DryRun {
		save(topo.RestoreDryRun, nil)
	} else {
		save(topo.RestoreDone, nil)
	}
	return res, nil
}

// archiveUpToNow makes a node's primary archive everything written so far.
func archiveUpToNow(ctx context.Context, n bucketmap.Node) error {
	c, err := dbnode.Connect(ctx, n)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	_, err = ArchiveNow(ctx, c, ArchiveWait)
	return err
}

// resolvePoint finds the restore point and the recovery target.
func resolvePoint(ctx context.Context, s *zksession.Session, p topo.Paths, opt RestoreOptions) (*topo.RestorePoint, Target, error) {
	if opt.Point != "" {
		rp, err := topo.ReadRestorePoint(ctx, s, p, opt.Point)
		if errors.Is(err, zksession.ErrNoNode) {
			return nil, Target{}, hint.New(fmt.Errorf("restore: no restore point %s", opt.Point), "shardctl restore-point list")
		}
		if err != nil {
			return nil, Target{}, err
		}
		return rp, Target{Name: rp.WALName}, nil
	}
	pts, err := topo.ListRestorePoints(ctx, s, p)
	if err != nil {
		return nil, Target{}, err
	}
	var best *topo.RestorePoint
	for _, rp := range pts {
		if !rp.At.After(opt.Time) {
			best = rp
		}
	}
	if best == nil {
		return nil, Target{}, hint.New(fmt.Errorf("restore: no restore point at or before %s: the map then is not known", opt.Time.UTC().Format(time.RFC3339)),
			"shardctl restore-point list; points are taken by `shardctl restore-point watch --every`")
	}
	if opt.Time.After(time.Now()) {
		return nil, Target{}, fmt.Errorf("restore: %s is in the future", opt.Time.UTC().Format(time.RFC3339))
	}
	return best, Target{Time: opt.Time}, nil
}

// sameOwnersSince refuses a restore to a time when the owner of part of
// the range changed between the point that gives the map and that time:
// a move that flipped after the point (its freeze, which stops the
// source's writes, at or before the time), or any other hand-off the
// map's history records in that interval (an assign, a node down).
func sameOwnersSince(ctx context.Context, s *zksession.Session, p topo.Paths, cur *bucketmap.Map, rp *topo.RestorePoint, lo, hi int64, t time.Time) error {
	ids, err := topo.ListMoves(ctx, s, p)
	if err != nil {
		return err
	}
	refuse := func(what string) error {
		return hint.New(fmt.Errorf("restore: %s changed the owner of part of the range after restore point %s and before %s", what, rp.Name, t.UTC().Format(time.RFC3339)),
			"restore to a restore point taken after it (shardctl restore-point list), or to a time before it")
	}
	for _, id := range ids {
		rec, _, err := topo.ReadMove(ctx, s, p, id)
		if errors.Is(err, zksession.ErrNoNode) {
			continue
		}
		if err != nil {
			return err
		}
		if rec.Hi < lo || rec.Lo > hi || rec.FlipVersion <= rp.MapVersion {
			continue // not of the range, or flipped before the point (or never)
		}
		if rec.FreezeStartedAt == nil || !rec.FreezeStartedAt.After(t) {
			return refuse(fmt.Sprintf("move %s (%s -> %s)", rec.ID, rec.Source, rec.Target))
		}
	}
	for _, h := range cur.History() {
		if h.UntilVersion <= rp.MapVersion || h.At.After(t) {
			continue
		}
		hlo, _, _ := keystream.Range(cur.Level, h.Lo)
		_, hhi, _ := keystream.Range(cur.Level, h.Hi)
		if hhi >= lo && hlo <= hi {
			return refuse(fmt.Sprintf("a hand-off from %s (map version %d)", h.Node, h.UntilVersion))
		}
	}
	return nil
}

// planPieces splits lo..hi by its owners at the point (pm) and now (cur).
// A part moving now refuses the restore.
func planPieces(pm, cur *bucketmap.Map, lo, hi int64) ([]Piece, error) {
	type seg struct {
		lo, hi int64
		node   string
	}
	segs := func(m *bucketmap.Map, now bool) ([]seg, error) {
		var out []seg
		var err error
		m.EachBucket(func(b bucketmap.Bucket, _, _ uint32) bool {
			blo, bhi := b.Keys()
			if bhi < lo || blo > hi {
				return true
			}
			if now && m.MetaOf(b).State == bucketmap.BucketMoving {
				err = hint.New(fmt.Errorf("%w: bucket %s is moving (move %s)", ErrBucketBusy, m.Name(b), m.MetaOf(b).Move), "wait for the move, or `shardctl move abort "+m.MetaOf(b).Move+"`")
				return false
			}
			out = append(out, seg{max(blo, lo), min(bhi, hi), string(m.OwnerOf(b))})
			return true
		})
		return out, err
	}
	from, err := segs(pm, false)
	if err != nil {
		return nil, err
	}
	to, err := segs(cur, true)
	if err != nil {
		return nil, err
	}
	var out []Piece
	i, j := 0, 0
	for i < len(from) && j < len(to) {
		plo, phi := max(from[i].lo, to[j].lo), min(from[i].hi, to[j].hi)
		if plo <= phi {
			if k := len(out) - 1; k >= 0 && out[k].From == from[i].node && out[k].To == to[j].node && out[k].Hi+1 == plo {
				out[k].Hi = phi
			} else {
				out = append(out, Piece{Lo: plo, Hi: phi, From: from[i].node, To: to[j].node})
			}
		}
		if from[i].hi < to[j].hi {
			i++
		} else {
			j++
		}
	}
	return out, nil
}

func chooseTables(all []topo.TableRecord, only []string) ([]topo.TableRecord, error) {
	if len(only) == 0 {
		return all, nil
	}
	var out []topo.TableRecord
	for _, name := range only {
		i := slices.IndexFunc(all, func(t topo.TableRecord) bool { return t.Name == name })
		if i < 0 {
			var names []string
			for _, t := range all {
				names = append(names, t.Name)
			}
			return nil, fmt.Errorf("restore: --tables: %s is not a sharded table of the cluster (it has %s)", name, strings.Join(names, ", "))
		}
		out = append(out, all[i])
	}
	return out, nil
}

// databaseOf is the database a node's DSN names.
func databaseOf(n bucketmap.Node) (string, error) {
	cfg, err := pgx.ParseConfig(n.DSN)
	if err != nil {
		return "", fmt.Errorf("node %s: its dsn: %w", n.ID, err)
	}
	return cfg.Database, nil
}

func newRestoreID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return time.Now().UTC().Format("20060102t150405") + "-" + hex.EncodeToString(b)
}

func appendMax(a, b []string, n int) []string {
	for _, s := range b {
		if len(a) >= n {
			break
		}
		a = append(a, s)
	}
	return a
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// nodeResult is one current owner's part of a restore.
type nodeResult struct {
	tables                             []TableResult
	staged                             int64
	stageMS, diffMS, pauseMS, waitedMS float64
}

// stagedTable is a table staged on a node.
type stagedTable struct {
	t     topo.TableRecord
	stage string   // the staging table, qualified and quoted
	cols  []string // the columns restored (the live table's that the point had)
	pk    []string // the live table's primary key
	// noSet: identity columns GENERATED ALWAYS outside the key, which an
	// UPDATE may not set (a changed one is left as it is now).
	noSet []string
}

// ownerWork is one current owner's part of a restore: its connection,
// pieces, staged tables and figures.
type ownerWork struct {
	node   bucketmap.Node
	c      *pgx.Conn
	pieces []Piece
	staged []stagedTable
	nr     *nodeResult
}

// close drops the staging tables and closes the connection.
func (w *ownerWork) close(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	for _, s := range w.staged {
		_, _ = w.c.Exec(ctx, `DROP TABLE IF EXISTS `+s.stage)
	}
	w.c.Close(ctx)
}

// prepareOn stages the node's pieces and diffs them. A dry run stops
// after it.
func prepareOn(ctx context.Context, n bucketmap.Node, pieces []Piece, tables []topo.TableRecord, scratch map[string]*Scratch, id string, opt RestoreOptions, say func(string, ...any)) (*ownerWork, error) {
	c, err := dbnode.Connect(ctx, n)
	if err != nil {
		return nil, err
	}
	w := &ownerWork{node: n, c: c, pieces: pieces, nr: &nodeResult{}}
	nr := w.nr
	// The diff and the apply join the staged rows with the live range by
	// primary key. A nested loop is never right for that, and the planner
	// picks one when the live table's statistics say the range is empty
	// (its rows deleted by the mistake, not yet vacuumed): each probe then
	// walks the range's dead tuples, and a million-row bucket took hours.
	if _, err := c.Exec(ctx, `SET enable_nestloop = off`); err != nil {
		return w, err
	}
	if _, err := c.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS shardvisor_restore`); err != nil {
		return w, fmt.Errorf("staging schema: %w", err)
	}
	staging := time.Now()
	for i, t := range tables {
		tr := TableResult{Table: t.Name}
		stg, skipped, err := stageTable(ctx, c, t, fmt.Sprintf("shardvisor_restore.%s", quoteIdent(fmt.Sprintf("r%s_%d", strings.ReplaceAll(id, "-", "_"), i))), pieces, scratch)
		if stg != nil {
			w.staged = append(w.staged, *stg)
		}
		if err != nil {
			return w, fmt.Errorf("%s: staging: %w", t.Name, err)
		}
		if skipped != "" {
			tr.Skipped = skipped
			say("%s: %s", t.Name, skipped)
		}
		nr.tables = append(nr.tables, tr)
	}
	for _, s := range w.staged {
		var rows int64
		if err := c.QueryRow(ctx, `SELECT count(*) FROM `+s.stage).Scan(&rows); err != nil {
			return w, err
		}
		nr.staged += rows
	}
	nr.stageMS = ms(time.Since(staging))
	say("node %s: %d rows staged from the point in %.0f ms", n.ID, nr.staged, nr.stageMS)
	diffing := time.Now()
	for _, s := range w.staged {
		k := slices.IndexFunc(nr.tables, func(tr TableResult) bool { return tr.Table == s.t.Name })
		if err := diffTable(ctx, c, s, pieces, opt.Samples, &nr.tables[k]); err != nil {
			return w, fmt.Errorf("%s: diff: %w", s.t.Name, err)
		}
		tr := nr.tables[k]
		say("node %s: %s: %d back, %d changed, %d gone since the point", n.ID, s.t.Name, tr.Back, tr.Changed, tr.Gone)
	}
	nr.diffMS = ms(time.Since(diffing))
	return w, nil
}

// apply applies what differs in one transaction, the bucket's pause,
// tried 3 times when writers held the range longer than LockTimeout. It
// applies nothing before the pause: restored rows would be seen and
// changed by users, and the pause would then undo their changes. So the
// restore takes effect at the pause's commit, all at once.
func (w *ownerWork) apply(ctx context.Context, opt RestoreOptions, say func(string, ...any)) error {
	if len(w.staged) == 0 {
		return nil
	}
	start := time.Now()
	for attempt := 1; ; attempt++ {
		pause, err := applyTx(ctx, w.c, w.node.ID, w.staged, w.pieces, opt)
		if err == nil {
			w.nr.pauseMS = ms(pause)
			// Writers also waited behind the attempts that gave up.
			w.nr.waitedMS = ms(time.Since(start))
			say("node %s: applied; the bucket's writes paused %.1f ms", w.node.ID, w.nr.pauseMS)
			return nil
		}
		if attempt == 3 || !isLockTimeout(err) {
			return fmt.Errorf("apply: %w", err)
		}
		say("node %s: writers held the bucket longer than %s; trying the pause again", w.node.ID, opt.LockTimeout)
	}
}

// stageTable creates the staging table and copies every piece's rows of t
// from its scratch server into it. skipped says why a table is left out.
// A staging table made is returned even with an error, to be dropped.
func stageTable(ctx context.Context, c *pgx.Conn, t topo.TableRecord, stage string, pieces []Piece, scratch map[string]*Scratch) (*stagedTable, string, error) {
	live, err := columnsOf(ctx, c, t.Name)
	if err != nil {
		return nil, "", err
	}
	if live == nil {
		return nil, "dropped since the point: not restored (restore it with the schema first, or leave it out with --tables)", nil
	}
	pk, err := primaryKey(ctx, c, t.Name)
	if err != nil {
		return nil, "", err
	}
	if len(pk) == 0 {
		return nil, "", fmt.Errorf("it has no primary key: rows cannot be matched")
	}
	var cols []column
	for _, from := range distinctFrom(pieces) {
		sc, err := scratch[from].Connect(ctx)
		if err != nil {
			return nil, "", fmt.Errorf("scratch server of %s: %w", from, err)
		}
		then, err := columnsOf(ctx, sc, t.Name)
		sc.Close(ctx)
		if err != nil {
			return nil, "", err
		}
		if then == nil {
			return nil, "not at the point (created since): nothing to restore", nil
		}
		// The live table's columns the point had, of the same type: a
		// binary copy of another type reads its bytes as this one's
		// (an int4 read as a float4, a timestamp as a timestamptz).
		var common []column
		for _, lc := range live {
			k := slices.IndexFunc(then, func(tc column) bool { return tc.name == lc.name })
			if k < 0 {
				continue
			}
			if then[k].typ != lc.typ {
				return nil, "", hint.New(fmt.Errorf("column %s was %s at the point and is %s now", lc.name, then[k].typ, lc.typ),
					"restore the other tables (--tables), or this one into a copy by hand from a scratch server")
			}
			common = append(common, lc)
		}
		if cols == nil || len(common) < len(cols) {
			cols = common
		}
	}
	names := make([]string, len(cols))
	for i, col := range cols {
		names[i] = col.name
	}
	for _, k := range pk {
		if !slices.Contains(names, k) {
			return nil, "", fmt.Errorf("primary key column %s was not at the point", k)
		}
	}
	colList := quoteList(names)
	if _, err := c.Exec(ctx, fmt.Sprintf(`CREATE UNLOGGED TABLE %s AS SELECT %s FROM %s WITH NO DATA`, stage, colList, qualified(t.Name))); err != nil {
		return nil, "", err
	}
	st := &stagedTable{t: t, stage: stage, cols: names, pk: pk}
	for _, col := range cols {
		if col.identityAlways && !slices.Contains(pk, col.name) {
			st.noSet = append(st.noSet, col.name)
		}
	}
	for _, pc := range pieces {
		sc, err := scratch[pc.From].Connect(ctx)
		if err != nil {
			return st, "", err
		}
		err = copyRange(ctx, sc, c, fmt.Sprintf(`COPY (SELECT %s FROM %s WHERE %s BETWEEN %d AND %d) TO STDOUT (FORMAT binary)`, colList, qualified(t.Name), quoteIdent(t.KeyColumn), pc.Lo, pc.Hi),
			fmt.Sprintf(`COPY %s (%s) FROM STDIN (FORMAT binary)`, stage, colList))
		sc.Close(ctx)
		if err != nil {
			return st, "", err
		}
	}
	if _, err := c.Exec(ctx, fmt.Sprintf(`CREATE INDEX ON %s (%s)`, stage, quoteList(pk))); err != nil {
		return st, "", err
	}
	if _, err := c.Exec(ctx, `ANALYZE `+stage); err != nil {
		return st, "", err
	}
	return st, "", nil
}

func distinctFrom(pieces []Piece) []string {
	var out []string
	for _, pc := range pieces {
		if !slices.Contains(out, pc.From) {
			out = append(out, pc.From)
		}
	}
	return out
}

// The diff's and apply's statements. In each, l is the live table, s the
// staging table; the range predicate limits l to the node's pieces.
func rangeOf(alias, key string, pieces []Piece) string {
	var or []string
	for _, pc := range pieces {
		or = append(or, fmt.Sprintf("%s.%s BETWEEN %d AND %d", alias, quoteIdent(key), pc.Lo, pc.Hi))
	}
	return "(" + strings.Join(or, " OR ") + ")"
}

func pkMatch(pk []string) string {
	var and []string
	for _, k := range pk {
		and = append(and, fmt.Sprintf("l.%s = s.%s", quoteIdent(k), quoteIdent(k)))
	}
	return strings.Join(and, " AND ")
}

// rowOf is the row of cols as text: compared as text, a json column
// (which has no equality), a citext's case and a numeric's scale differ
// as they should.
func rowOf(alias string, cols []string) string {
	var out []string
	for _, c := range cols {
		out = append(out, alias+"."+quoteIdent(c))
	}
	return "ROW(" + strings.Join(out, ", ") + ")::text"
}

type diffSQL struct{ back, changed, gone string }

func diffQueries(st stagedTable, pieces []Piece) diffSQL {
	t, key := qualified(st.t.Name), st.t.KeyColumn
	in := rangeOf("l", key, pieces)
	return diffSQL{
		back:    fmt.Sprintf(`FROM %s s WHERE NOT EXISTS (SELECT 1 FROM %s l WHERE %s AND %s)`, st.stage, t, pkMatch(st.pk), in),
		changed: fmt.Sprintf(`FROM %s s JOIN %s l ON %s AND %s WHERE %s IS DISTINCT FROM %s`, st.stage, t, pkMatch(st.pk), in, rowOf("s", st.cols), rowOf("l", st.cols)),
		gone:    fmt.Sprintf(`FROM %s l WHERE %s AND NOT EXISTS (SELECT 1 FROM %s s WHERE %s)`, t, in, st.stage, pkMatch(st.pk)),
	}
}

func diffTable(ctx context.Context, c *pgx.Conn, st stagedTable, pieces []Piece, samples int, tr *TableResult) error {
	q := diffQueries(st, pieces)
	for _, k := range []struct {
		from string
		n    *int64
		keys *[]string
		of   string
	}{{q.back, &tr.Back, &tr.BackKeys, "s"}, {q.changed, &tr.Changed, &tr.ChangedKeys, "s"}, {q.gone, &tr.Gone, &tr.GoneKeys, "l"}} {
		if err := c.QueryRow(ctx, `SELECT count(*) `+k.from).Scan(k.n); err != nil {
			return err
		}
		rows, err := c.Query(ctx, fmt.Sprintf(`SELECT %s %s ORDER BY 1 LIMIT %d`, rowOf(k.of, st.pk), k.from, samples))
		if err != nil {
			return err
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		*k.keys = keys
	}
	return nil
}

// applyTx applies what differs on one node in one transaction, the
// bucket's write pause: it holds the fence's drain locks of the pieces'
// granules. It returns how long writers were held back. Read committed:
// each statement sees what the writers drained before it committed.
func applyTx(ctx context.Context, c *pgx.Conn, node bucketmap.NodeID, staged []stagedTable, pieces []Piece, opt RestoreOptions) (time.Duration, error) {
	tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, opt.LockTimeout.Milliseconds())); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		return 0, err
	}
	// A flip of this node's fence takes fence_meta FOR UPDATE: none
	// commits while this transaction runs.
	if _, err := tx.Exec(ctx, `SELECT 1 FROM shardvisor.fence_meta FOR SHARE`); err != nil {
		return 0, fmt.Errorf("the node's fence: %w", err)
	}
	// The statements are written before the pause, and sent in one batch
	// inside it: each round trip in the pause is one the bucket's writers
	// wait for.
	var stmts, names []string
	for _, st := range staged {
		t := qualified(st.t.Name)
		in := rangeOf("l", st.t.KeyColumn, pieces)
		if opt.Mode == ModeReplace {
			var set []string
			for _, col := range st.cols {
				if slices.Contains(st.pk, col) || slices.Contains(st.noSet, col) {
					continue // equal by the match, or not settable
				}
				set = append(set, fmt.Sprintf("%s = s.%s", quoteIdent(col), quoteIdent(col)))
			}
			if len(set) > 0 {
				stmts = append(stmts, fmt.Sprintf(`UPDATE %s l SET %s FROM %s s WHERE %s AND %s AND %s IS DISTINCT FROM %s`, t, strings.Join(set, ", "), st.stage, pkMatch(st.pk), in, rowOf("s", st.cols), rowOf("l", st.cols)))
				names = append(names, st.t.Name)
			}
			stmts = append(stmts, fmt.Sprintf(`DELETE FROM %s l WHERE %s AND NOT EXISTS (SELECT 1 FROM %s s WHERE %s)`, t, in, st.stage, pkMatch(st.pk)))
			names = append(names, st.t.Name)
		}
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO %s (%s) OVERRIDING SYSTEM VALUE SELECT %s FROM %s s WHERE NOT EXISTS (SELECT 1 FROM %s l WHERE %s AND %s)`,
			t, quoteList(st.cols), quoteListOf("s", st.cols), st.stage, t, pkMatch(st.pk), in))
		names = append(names, st.t.Name)
	}
	var gs []int32
	for _, pc := range pieces {
		for g := fence.Granule(pc.Lo); g <= fence.Granule(pc.Hi); g++ {
			gs = append(gs, g)
		}
	}
	slices.Sort(gs)
	gs = slices.Compact(gs)
	held := time.Now()
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.pg_advisory_xact_lock($1, g) FROM unnest($2::int4[]) WITH ORDINALITY AS u(g, i) ORDER BY i`, fence.LockClass, gs); err != nil {
		return 0, err
	}
	f, err := fence.Read(ctx, tx)
	if err != nil {
		return 0, err
	}
	for _, pc := range pieces {
		if !covered(f.Spans, pc.Lo, pc.Hi) {
			return 0, hint.New(fmt.Errorf("node %s no longer owns keys %d..%d (the bucket moved during the restore)", node, pc.Lo, pc.Hi), "run the restore again")
		}
	}
	b := &pgx.Batch{}
	for _, q := range stmts {
		b.Queue(q)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("%s: %w", batchTable(err, names), err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return time.Since(held), nil
}

// batchTable names the tables of a failed batch (pgx does not say which
// statement of a batch failed).
func batchTable(_ error, names []string) string {
	return strings.Join(slices.Compact(slices.Clone(names)), ", ")
}

// covered: lo..hi lies in spans owned.
func covered(spans []fence.Span, lo, hi int64) bool {
	next := lo
	for _, s := range spans {
		if s.State != fence.Owned || s.Hi < next || s.Lo > next {
			continue
		}
		if s.Hi >= hi {
			return true
		}
		next = s.Hi + 1
	}
	return false
}

func isLockTimeout(err error) bool {
	return strings.Contains(err.Error(), "SQLSTATE 55P03")
}

// column is a writable column: its name, its type as format_type gives
// it, and whether it is an identity column GENERATED ALWAYS.
type column struct {
	name, typ      string
	identityAlways bool
}

// columnsOf lists a table's columns that can be written (not dropped, not
// generated), in order; nil if the table does not exist.
func columnsOf(ctx context.Context, q fence.Querier, table string) ([]column, error) {
	rows, err := q.Query(ctx, `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attidentity = 'a' FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
		ORDER BY a.attnum`, table)
	if err != nil {
		return nil, err
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (column, error) {
		var c column
		err := r.Scan(&c.name, &c.typ, &c.identityAlways)
		return c, err
	})
	if err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		var exists bool
		if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
			return nil, err
		}
	}
	return cols, nil
}

func primaryKey(ctx context.Context, q fence.Querier, table string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT a.attname::text FROM pg_index i
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		WHERE i.indrelid = to_regclass($1) AND i.indisprimary
		ORDER BY array_position(i.indkey::int2[], a.attnum)`, table)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func qualified(name string) string {
	schema, table, _ := strings.Cut(name, ".")
	return quoteIdent(schema) + "." + quoteIdent(table)
}

func quoteList(cols []string) string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = quoteIdent(c)
	}
	return strings.Join(out, ", ")
}

func quoteListOf(alias string, cols []string) string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = alias + "." + quoteIdent(c)
	}
	return strings.Join(out, ", ")
}
