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
