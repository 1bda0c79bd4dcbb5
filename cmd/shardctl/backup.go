package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/backup"
	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/topo"
)

// pgbackrestFlags are the flags of every command that runs pgBackRest.
func pgbackrestFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "pgbackrest", Value: "pgbackrest", EnvVars: []string{"SHARDVISOR_PGBACKREST"},
			Usage: "pgBackRest's `COMMAND`, with what runs it as the repository's owner in front (\"runuser -u postgres -- pgbackrest\"); scratch servers run with the same prefix"},
		&cli.StringFlag{Name: "pgbackrest-config", EnvVars: []string{"SHARDVISOR_PGBACKREST_CONFIG"},
			Usage: "pgBackRest configuration `FILE` naming every node's stanza (default: pgBackRest's own, /etc/pgbackrest/pgbackrest.conf)"},
	}
}

func pgbackrestOf(c *cli.Context) backup.PGBackRest {
	return backup.PGBackRest{Command: strings.Fields(c.String("pgbackrest")), Config: c.String("pgbackrest-config")}
}

// operator names who runs a command, for the records.
func operator() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

func runBackupConfigure(c *cli.Context) error {
	if c.NArg() != 1 {
		return cliutil.Usagef("backup configure: give one node id")
	}
	id := c.Args().First()
	stanza := c.String("stanza")
	if stanza != "" {
		if err := topo.ValidStanza(stanza); err != nil {
			return cliutil.Usagef("backup configure: --stanza: %v", err)
		}
	}
	if ma := c.String("max-age"); ma != "" {
		if d, err := time.ParseDuration(ma); err != nil || d <= 0 {
			return cliutil.Usagef("backup configure: --max-age %q is not a positive duration (26h, 90m)", ma)
		}
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		m, _, err := st.Load(ctx)
		if err != nil {
			return err
		}
		if _, ok := m.Node(bucketmap.NodeID(id)); !ok {
			return fmt.Errorf("backup configure: %w: %s", bucketmap.ErrUnknownNode, id)
		}
		cfg, err := topo.UpdateBackupConfig(ctx, st.Session(), st.Paths(), func(b *topo.BackupConfig) error {
			switch {
			case c.Bool("remove"):
				delete(b.Stanzas, id)
			case stanza != "":
				b.Stanzas[id] = stanza
			}
			if ma := c.String("max-age"); ma != "" {
				b.MaxAge = ma
			}
			return nil
		})
		if err != nil {
			return err
		}
		if stanza != "" && c.Bool("create") {
			if err := pgbackrestOf(c).StanzaCreate(ctx, stanza); err != nil {
				return err
			}
		}
		return cliutil.NewPrinter(c).Emit(cfg, func(w io.Writer) {
			fmt.Fprintf(w, "node %s: stanza %q; backups older than %s are a problem\n", id, cfg.Stanzas[id], cfg.MaxAgeOrDefault())
		})
	})
}

// backupNodes resolves the node ids given (all not removed when none).
func backupNodes(m *bucketmap.Map, args []string) ([]bucketmap.Node, error) {
	var out []bucketmap.Node
	if len(args) == 0 {
		for _, n := range m.Nodes() {
			if n.State != bucketmap.NodeRemoved {
				out = append(out, n)
			}
		}
		return out, nil
	}
	for _, a := range args {
		n, ok := m.Node(bucketmap.NodeID(a))
		if !ok {
			return nil, fmt.Errorf("%w: %s", bucketmap.ErrUnknownNode, a)
		}
		out = append(out, n)
	}
	return out, nil
}

func runBackup(c *cli.Context) error {
	typ := c.String("type")
	if typ != backup.Full && typ != backup.Diff && typ != backup.Incr {
		return cliutil.Usagef("backup: --type must be full, diff or incr, not %q", typ)
	}
	pg := pgbackrestOf(c)
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		m, _, err := st.Load(ctx)
		if err != nil {
			return err
		}
		nodes, err := backupNodes(m, c.Args().Slice())
		if err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		cfg, _, err := topo.ReadBackupConfig(ctx, st.Session(), st.Paths())
		if err != nil {
			return err
		}
		type taken struct {
			Node   string             `json:"node"`
			Stanza string             `json:"stanza"`
			Backup *backup.BackupInfo `json:"backup,omitempty"`
			Error  string             `json:"error,omitempty"`
		}
		var out []taken
		failed := 0
		for _, n := range nodes {
			stanza := cfg.Stanzas[string(n.ID)]
			if stanza == "" {
				out = append(out, taken{Node: string(n.ID), Error: "no stanza configured (shardctl backup configure " + string(n.ID) + " --stanza NAME)"})
				failed++
				continue
			}
			fmt.Fprintf(c.App.ErrWriter, "%s  backup of %s (stanza %s, %s): running\n", time.Now().Format("15:04:05.000"), n.ID, stanza, typ)
			start := time.Now()
			info, err := pg.Backup(ctx, stanza, typ)
			if err != nil {
				out = append(out, taken{Node: string(n.ID), Stanza: stanza, Error: err.Error()})
				failed++
				continue
			}
			t := taken{Node: string(n.ID), Stanza: stanza, Backup: info.Newest()}
			out = append(out, t)
			fmt.Fprintf(c.App.ErrWriter, "%s  backup of %s: done in %s\n", time.Now().Format("15:04:05.000"), n.ID, time.Since(start).Round(time.Millisecond))
		}
		if err := cliutil.NewPrinter(c).Emit(map[string]any{"backups": out}, func(w io.Writer) {
			for _, t := range out {
				if t.Error != "" {
					fmt.Fprintf(w, "node %s: FAILED: %s\n", t.Node, t.Error)
					continue
				}
				fmt.Fprintf(w, "node %s: %s backup %s (WAL %s..%s, %s)\n", t.Node, t.Backup.Type, t.Backup.Label, t.Backup.WALStart, t.Backup.WALStop, byteSize(t.Backup.RepoSize))
			}
		}); err != nil {
			return err
		}
		if failed > 0 {
			return fmt.Errorf("backup: %d of %d nodes failed", failed, len(nodes))
		}
		return nil
	})
}

// backupStatus reads every given node's backups and archiving.
func backupStatus(ctx context.Context, c *cli.Context, st *bucketmap.Store, nodes []bucketmap.Node) ([]backup.NodeStatus, error) {
	cfg, _, err := topo.ReadBackupConfig(ctx, st.Session(), st.Paths())
	if err != nil {
		return nil, err
	}
	pg := pgbackrestOf(c)
	var out []backup.NodeStatus
	for _, n := range nodes {
		conn, err := dbnode.Connect(ctx, n)
		if err != nil {
			conn = nil
		}
		ns := backup.CheckNode(ctx, pg, cfg, cfg.Configured(), n, conn, time.Now())
		if conn != nil {
			conn.Close(ctx)
		} else {
			ns.Problems = append(ns.Problems, fmt.Sprintf("cannot reach the node to read its archiving: %v", err))
		}
		out = append(out, ns)
	}
	return out, nil
}

func writeBackupStatus(w io.Writer, ns backup.NodeStatus, list bool, info *backup.StanzaInfo) {
	switch {
	case !ns.Configured:
		fmt.Fprintf(w, "node %s: backups not configured (shardctl backup configure %s --stanza NAME)\n", ns.Node, ns.Node)
	case ns.Newest != nil:
		fmt.Fprintf(w, "node %s: stanza %s, %d backups, newest %s (%s ago), WAL archived %s..%s\n", ns.Node, ns.Stanza, ns.Backups, ns.Newest.Label,
			(time.Duration(ns.AgeSeconds) * time.Second).String(), ns.WALMin, ns.WALMax)
	default:
		fmt.Fprintf(w, "node %s: stanza %s\n", ns.Node, ns.Stanza)
	}
	if a := ns.Archiver; a != nil && ns.Configured {
		last := "never"
		if a.LastArchivedAt != nil {
			last = a.LastArchivedWAL + " at " + a.LastArchivedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "  archiving: %s, %d segments archived (last %s), %d failures\n", a.Mode, a.Archived, last, a.Failed)
	}
	if list && info != nil {
		for _, b := range info.Backups {
			fmt.Fprintf(w, "  %-26s %-4s %s .. %s  WAL %s..%s  LSN %s..%s  %s (repo %s)\n", b.Label, b.Type, b.Start.Format(time.RFC3339), b.Stop.Format("15:04:05"),
				b.WALStart, b.WALStop, b.LSNStart, b.LSNStop, byteSize(b.Size), byteSize(b.RepoSize))
		}
	}
	for _, p := range ns.Problems {
		fmt.Fprintf(w, "  PROBLEM: %s\n", p)
	}
}

func runBackupList(c *cli.Context) error {
	pg := pgbackrestOf(c)
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		m, _, err := st.Load(ctx)
		if err != nil {
			return err
		}
		nodes, err := backupNodes(m, c.Args().Slice())
		if err != nil {
			return fmt.Errorf("backup list: %w", err)
		}
		statuses, err := backupStatus(ctx, c, st, nodes)
		if err != nil {
			return err
		}
		type listed struct {
			backup.NodeStatus
			All []backup.BackupInfo `json:"backups_list"`
		}
		var out []listed
		problems := 0
		infos := map[string]*backup.StanzaInfo{}
		for _, ns := range statuses {
			l := listed{NodeStatus: ns, All: []backup.BackupInfo{}}
			if ns.Stanza != "" {
				if info, err := pg.Info(ctx, ns.Stanza); err == nil {
					l.All, infos[ns.Node] = info.Backups, info
				}
			}
			problems += len(ns.Problems)
			out = append(out, l)
		}
		if err := cliutil.NewPrinter(c).Emit(map[string]any{"nodes": out}, func(w io.Writer) {
			for _, l := range out {
				writeBackupStatus(w, l.NodeStatus, true, infos[l.Node])
			}
		}); err != nil {
			return err
		}
		if problems > 0 {
			return fmt.Errorf("backup list: %d problems", problems)
		}
		return nil
	})
}

func runPointCreate(c *cli.Context) error {
	if c.NArg() != 1 {
		return cliutil.Usagef("restore-point create: give the point's name")
	}
	name := c.Args().First()
	if err := topo.ValidPointName(name); err != nil {
		return cliutil.Usagef("restore-point create: %v", err)
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		rp, err := backup.CreatePoint(ctx, st, name, backup.PointOptions{Reason: c.String("reason"), By: operator(), SwitchWAL: !c.Bool("no-switch-wal"), Logger: log})
		if err != nil {
			return err
		}
		return cliutil.NewPrinter(c).Emit(rp, func(w io.Writer) { writePoint(w, rp, true) })
	})
}

func writePoint(w io.Writer, rp *topo.RestorePoint, nodes bool) {
	fmt.Fprintf(w, "%s  %s  map version %d, %d nodes, %d moves in flight, cut %.1f ms (%d tries), %s by %s\n", rp.Name, rp.At.Format(time.RFC3339), rp.MapVersion, len(rp.Nodes), len(rp.Moves), rp.CutMS, rp.Attempts, rp.Reason, rp.By)
	if !nodes {
		return
	}
	ids := make([]string, 0, len(rp.Nodes))
	for id := range rp.Nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		pn := rp.Nodes[id]
		fmt.Fprintf(w, "  node %s: LSN %s, timeline %d, fence at map version %d, stanza %q\n", id, pn.LSN, pn.Timeline, pn.FenceVersion, pn.Stanza)
	}
	for _, mv := range rp.Moves {
		fmt.Fprintf(w, "  move %s in flight: bucket %s %s -> %s (%s)\n", mv.ID, mv.Bucket, mv.Source, mv.Target, mv.State)
	}
}

func runPointList(c *cli.Context) error {
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		pts, err := topo.ListRestorePoints(ctx, st.Session(), st.Paths())
		if err != nil {
			return err
		}
		if pts == nil {
			pts = []*topo.RestorePoint{}
		}
		return cliutil.NewPrinter(c).Emit(map[string]any{"points": pts}, func(w io.Writer) {
			if len(pts) == 0 {
				fmt.Fprintln(w, "no restore points (shardctl restore-point create NAME)")
			}
			for _, rp := range pts {
				writePoint(w, rp, c.Bool("verbose"))
			}
		})
	})
}

func runPointDelete(c *cli.Context) error {
	if c.NArg() != 1 {
		return cliutil.Usagef("restore-point delete: give the point's name")
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		err := topo.DeleteRestorePoint(ctx, st.Session(), st.Paths(), c.Args().First())
		if err != nil {
			return fmt.Errorf("restore-point delete %s: %w", c.Args().First(), err)
		}
		return cliutil.NewPrinter(c).Emit(map[string]any{"deleted": c.Args().First()}, func(w io.Writer) {
			fmt.Fprintf(w, "restore point %s forgotten (its WAL records stay in the archive)\n", c.Args().First())
		})
	})
}

// runPointWatch takes a restore point every --every, named PREFIX-TIME,
// forgets all but the newest --keep of its own, and every --check-every
// checks every node's backups and archiving: its metrics (--metrics-addr)
// and the status record the status page shows (topo.BackupStatus).
func runPointWatch(c *cli.Context) error {
	every, checkEvery := c.Duration("every"), c.Duration("check-every")
	if every < time.Second || checkEvery < time.Second {
		return cliutil.Usagef("restore-point watch: --every and --check-every must be at least 1s, not %s and %s", every, checkEvery)
	}
	prefix := c.String("prefix")
	if err := topo.ValidPointName(prefix); err != nil || len(prefix) > 28 {
		return cliutil.Usagef("restore-point watch: --prefix %q must be a valid point name of at most 28 bytes", prefix)
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		reg := prometheus.NewRegistry()
		metrics := backup.NewMetrics(reg)
		stop, err := serveMetricsFlag(c, reg, log)
		if err != nil {
			return err
		}
		defer stop()
		p := cliutil.NewPrinter(c)
		check := func() {
			m, _, err := st.Load(ctx)
			if err != nil {
				log.Warn("restore-point watch: reading the map", zap.Error(err))
				return
			}
			nodes, _ := backupNodes(m, nil)
			statuses, err := backupStatus(ctx, c, st, nodes)
			if err != nil {
				log.Warn("restore-point watch: backup status", zap.Error(err))
				return
			}
			metrics.Status(statuses)
			rec := &topo.BackupStatus{At: time.Now().UTC(), By: operator()}
			for _, ns := range statuses {
				rec.Nodes = append(rec.Nodes, topo.BackupNodeStatus{Node: ns.Node, Stanza: ns.Stanza, NewestAt: newestAt(ns), Problems: ns.Problems})
				for _, pr := range ns.Problems {
					log.Warn("backup problem", zap.String("node", ns.Node), zap.String("problem", pr))
				}
			}
			if err := topo.WriteBackupStatus(ctx, st.Session(), st.Paths(), rec); err != nil {
				log.Warn("restore-point watch: writing the status record", zap.Error(err))
			}
		}
		nextPoint, nextCheck := time.Now(), time.Now()
		for {
			if now := time.Now(); !now.Before(nextPoint) {
				nextPoint = now.Add(every)
				name := prefix + "-" + now.UTC().Format("20060102t150405")
				rp, err := backup.CreatePoint(ctx, st, name, backup.PointOptions{Reason: "schedule", By: operator(), SwitchWAL: true, Logger: log})
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					metrics.Point(nil)
					log.Warn("restore-point watch: point failed", zap.String("point", name), zap.Error(err))
				} else {
					metrics.Point(rp)
					_ = p.Emit(rp, func(w io.Writer) { writePoint(w, rp, false) })
					if err := prunePoints(ctx, st, prefix+"-", c.Int("keep")); err != nil {
						log.Warn("restore-point watch: pruning old points", zap.Error(err))
					}
				}
			}
			if now := time.Now(); !now.Before(nextCheck) {
				nextCheck = now.Add(checkEvery)
				check()
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Until(minTime(nextPoint, nextCheck))):
			}
		}
	})
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func newestAt(ns backup.NodeStatus) *time.Time {
	if ns.Newest == nil {
		return nil
	}
	t := ns.Newest.Stop
	return &t
}

// prunePoints forgets, beyond the newest keep of each (0: keep all), the
// scheduled points this watcher names (PREFIX-TIME, nothing else: another
// watcher's prefix may begin with this one's) and the points taken before
// changes (before-WHAT-TIME, which a rebalance --watch takes on every run
// that moves something).
func prunePoints(ctx context.Context, st *bucketmap.Store, prefix string, keep int) error {
	if keep <= 0 {
		return nil
	}
	pts, err := topo.ListRestorePoints(ctx, st.Session(), st.Paths())
	if err != nil {
		return err
	}
	own := regexp.MustCompile("^" + regexp.QuoteMeta(prefix) + `\d{8}t\d{6}$`)
	var scheduled, before []*topo.RestorePoint
	for _, rp := range pts {
		switch {
		case rp.Reason == "schedule" && own.MatchString(rp.Name):
			scheduled = append(scheduled, rp)
		case strings.HasPrefix(rp.Reason, "before "):
			before = append(before, rp)
		}
	}
	for _, list := range [][]*topo.RestorePoint{scheduled, before} {
		for i := 0; i < len(list)-keep; i++ {
			if err := topo.DeleteRestorePoint(ctx, st.Session(), st.Paths(), list[i].Name); err != nil {
				return err
			}
		}
	}
	return nil
}

func runRestoreList(c *cli.Context) error {
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		recs, err := topo.ListBucketRestores(ctx, st.Session(), st.Paths())
		if err != nil {
			return err
		}
		if recs == nil {
			recs = []*topo.BucketRestore{}
		}
		return cliutil.NewPrinter(c).Emit(map[string]any{"restores": recs}, func(w io.Writer) {
			if len(recs) == 0 {
				fmt.Fprintln(w, "no bucket restore recorded")
			}
			for _, r := range recs {
				to := r.Point
				if !r.Time.IsZero() {
					to = r.Time.Format(time.RFC3339) + " (map of " + r.Point + ")"
				}
				fmt.Fprintf(w, "%s  %s  bucket %s to %s, mode %s: %s by %s", r.ID, r.At.Format(time.RFC3339), r.Bucket, to, r.Mode, r.State, r.By)
				if r.Error != "" {
					fmt.Fprintf(w, ": %s", r.Error)
				}
				fmt.Fprintln(w)
				if r.State != topo.RestoreDone && r.State != topo.RestoreDryRun && r.State != topo.RestoreFailed {
					for _, d := range r.Scratch {
						fmt.Fprintf(w, "  its scratch directory, if the restore is not running any more: %s (stop its server: pg_ctl -D %s/data stop; then remove it)\n", d, d)
					}
				}
			}
		})
	})
}

// pointBefore takes a restore point before a change (schema, rebalance),
// when the cluster has backups configured; where it cannot, the change
// goes on only with --no-restore-point.
func pointBefore(ctx context.Context, c *cli.Context, st *bucketmap.Store, log *zap.Logger, what string) error {
	if c.Bool("no-restore-point") {
		return nil
	}
	cfg, _, err := topo.ReadBackupConfig(ctx, st.Session(), st.Paths())
	if err != nil || !cfg.Configured() {
		return err // no backups configured: nothing to point at
	}
	if len(what) > 21 {
		what = what[:21] // a point's name is at most 48 bytes
	}
	name := "before-" + what + "-" + time.Now().UTC().Format("20060102t150405.000")
	rp, err := backup.CreatePoint(ctx, st, name, backup.PointOptions{Reason: "before " + what, By: operator(), SwitchWAL: true, Logger: log})
	if err != nil {
		return fmt.Errorf("restore point before %s: %w (give --no-restore-point to go on without one)", what, err)
	}
	fmt.Fprintf(c.App.ErrWriter, "%s  restore point %s taken (map version %d)\n", time.Now().Format("15:04:05.000"), rp.Name, rp.MapVersion)
	return nil
}

func runRestore(c *cli.Context) error {
	if (c.NArg() == 1) == c.IsSet("user") || c.NArg() > 1 {
		return cliutil.Usagef("restore: give one bucket (NUMBER, or PREFIX/DEPTH), or --user UID for one user's rows")
	}
	to := c.String("to")
	if to == "" {
		return cliutil.Usagef("restore: --to is required: a restore point's name or a time (RFC 3339, or -DURATION: -1m is a minute ago)")
	}
	opt := backup.RestoreOptions{Bucket: c.Args().First(), User: c.String("user"), Mode: c.String("mode"), DryRun: c.Bool("dry-run"), PGBackRest: pgbackrestOf(c),
		ScratchDir: c.String("scratch-dir"), PGBin: c.String("pg-bin"), By: operator()}
	if opt.Mode != backup.ModeReplace && opt.Mode != backup.ModeMissing {
		return cliutil.Usagef("restore: --mode must be %s or %s, not %q", backup.ModeReplace, backup.ModeMissing, opt.Mode)
	}
	for _, t := range c.StringSlice("tables") {
		for _, name := range strings.Split(t, ",") {
			if name = strings.TrimSpace(name); name != "" {
				opt.Tables = append(opt.Tables, name)
			}
		}
	}
	if t, ok, err := parseWhen(to, time.Now()); err != nil {
		return cliutil.Usagef("restore: --to: %v", err)
	} else if ok {
		opt.Time = t
	} else {
		opt.Point = to
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		opt.Logger = log
		opt.Progress = func(msg string) {
			fmt.Fprintf(c.App.ErrWriter, "%s  restore: %s\n", time.Now().Format("15:04:05.000"), msg)
		}
		res, err := backup.RestoreBucket(ctx, st, opt)
		if err != nil {
			return err
		}
		return cliutil.NewPrinter(c).Emit(res, func(w io.Writer) { writeRestore(w, res) })
	})
}

// parseWhen reads --to: an RFC 3339 time, or -DURATION before now; ok is
// false for anything else (a restore point's name).
func parseWhen(s string, now time.Time) (time.Time, bool, error) {
	if strings.HasPrefix(s, "-") {
		d, err := time.ParseDuration(s[1:])
		if err != nil || d <= 0 {
			return time.Time{}, false, fmt.Errorf("%q is not -DURATION (-90s, -5m)", s)
		}
		return now.Add(-d), true, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, true, nil
	}
	if len(s) >= 4 && s[0] >= '0' && s[0] <= '9' && strings.Contains(s, ":") {
		return time.Time{}, false, fmt.Errorf("%q looks like a time but is not RFC 3339 (2026-11-30T08:00:00Z)", s)
	}
	return time.Time{}, false, nil
}

func writeRestore(w io.Writer, r *backup.RestoreResult) {
	verb := "restored"
	if r.DryRun {
		verb = "would restore (dry run)"
	}
	what := fmt.Sprintf("bucket %s (keys %d..%d)", r.Bucket, r.Lo, r.Hi)
	if r.User != "" {
		what = fmt.Sprintf("user %s's rows (key %d, bucket %s)", r.User, r.Lo, r.Bucket)
	}
	fmt.Fprintf(w, "%s %s to %s (point %s), mode %s\n", what, verb, r.Target, r.Point, r.Mode)
	for _, pc := range r.Pieces {
		fmt.Fprintf(w, "  keys %d..%d: from %s at the point into %s now\n", pc.Lo, pc.Hi, pc.From, pc.To)
	}
	for _, t := range r.Tables {
		if t.Skipped != "" {
			fmt.Fprintf(w, "  %s: skipped: %s\n", t.Table, t.Skipped)
			continue
		}
		gone := "go"
		if r.Mode == backup.ModeMissing {
			gone = "stay (mode missing)"
		}
		fmt.Fprintf(w, "  %s: %d rows come back, %d change back, %d made since %s\n", t.Table, t.Back, t.Changed, t.Gone, gone)
		for _, k := range []struct {
			what string
			keys []string
		}{{"back", t.BackKeys}, {"changed", t.ChangedKeys}, {"since", t.GoneKeys}} {
			if len(k.keys) > 0 {
				fmt.Fprintf(w, "    %s: %s\n", k.what, strings.Join(k.keys, " "))
			}
		}
	}
	fmt.Fprintf(w, "  %d rows staged; recovery %.0f ms, staging %.0f ms, diff %.0f ms, the bucket's write pause %.1f ms (%.1f ms with retries); %.1f s in all\n",
		r.Staged, r.RecoverMS, r.StageMS, r.DiffMS, r.PauseMS, r.WaitedMS, r.TotalMS/1000)
}

// runPointShow prints a restore point and, per node, the command that
// recovers its server to the point: the whole-cluster runbook's first
// step (docs/backups.md).
func runPointShow(c *cli.Context) error {
	if c.NArg() != 1 {
		return cliutil.Usagef("restore-point show: give the point's name")
	}
	name := c.Args().First()
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		rp, err := topo.ReadRestorePoint(ctx, st.Session(), st.Paths(), name)
		if err != nil {
			return fmt.Errorf("restore-point show %s: %w", name, err)
		}
		cmds := map[string]string{}
		pg := pgbackrestOf(c)
		for id, pn := range rp.Nodes {
			// The backup set: the newest that ended before the point.
			set := ""
			if pn.Stanza != "" {
				info, err := pg.Info(ctx, pn.Stanza)
				if err == nil {
					set, err = backup.ChooseSet(info, backup.Target{Name: rp.WALName, LSN: pn.LSN})
				}
				if err != nil {
					cmds[id] = "# " + hint.Text(err)
					continue
				}
			}
			cmd, err := backup.RecoveryCommand(rp, id, strings.ReplaceAll(c.String("data-dir"), "{node}", id), set)
			if err != nil {
				cmd = "# " + err.Error()
			}
			cmds[id] = cmd
		}
		return cliutil.NewPrinter(c).Emit(map[string]any{"point": rp, "recovery_commands": cmds}, func(w io.Writer) {
			writePoint(w, rp, true)
			fmt.Fprintln(w, "to recover each node's server to this point (on its new host, as the repository's owner):")
			ids := make([]string, 0, len(cmds))
			for id := range cmds {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			for _, id := range ids {
				fmt.Fprintf(w, "  %s: %s\n", id, cmds[id])
			}
			fmt.Fprintf(w, "then point each node at its new server (shardctl node set-dsn ID DSN) and run: shardctl restore-point apply-map %s\n", rp.Name)
		})
	})
}

func runPointApplyMap(c *cli.Context) error {
	if c.NArg() != 1 {
		return cliutil.Usagef("restore-point apply-map: give the point's name")
	}
	name := c.Args().First()
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		res, err := backup.ApplyPointMap(ctx, st, name, log)
		if err != nil {
			return err
		}
		if err := cliutil.NewPrinter(c).Emit(res, func(w io.Writer) {
			fmt.Fprintf(w, "map version %d now has the buckets of restore point %s (map version %d then)\n", res.MapVersion, res.Point, res.From)
			for _, td := range res.Moves {
				fmt.Fprintf(w, "  move %s in flight then (flipped: %v): %s\n", td.ID, td.Flipped, strings.Join(td.Done, "; "))
				for _, e := range td.Errors {
					fmt.Fprintf(w, "    ERROR: %s\n", e)
				}
			}
			for _, d := range res.Drift {
				fmt.Fprintf(w, "  node %s: fence %s: %s\n", d.Node, d.Status, d.Detail)
			}
		}); err != nil {
			return err
		}
		bad := len(res.Drift)
		for _, td := range res.Moves {
			bad += len(td.Errors)
		}
		if bad > 0 {
			return hint.New(fmt.Errorf("restore-point apply-map: %d problems", bad), "bring the nodes up and run it again (every step is idempotent), then shardctl node check on each node")
		}
		return nil
	})
}
