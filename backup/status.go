package backup

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/topo"
)

// NodeStatus is one node's backups and archiving, and what is wrong with
// them.
type NodeStatus struct {
	Node   string `json:"node"`
	Stanza string `json:"stanza,omitempty"`
	// Newest is the newest good backup; Age its age at the check.
	Newest     *BackupInfo `json:"newest,omitempty"`
	AgeSeconds float64     `json:"age_seconds,omitempty"`
	Backups    int         `json:"backups"`
	WALMin     string      `json:"wal_min,omitempty"`
	WALMax     string      `json:"wal_max,omitempty"`
	// Archiver is the primary's pg_stat_archiver (nil: not read).
	Archiver *Archiver `json:"archiver,omitempty"`
	// Problems: each is something to act on. Configured is false when the
	// cluster has no backup configuration at all (then nothing is a
	// problem: backups were never set up).
	Problems   []string `json:"problems"`
	Configured bool     `json:"configured"`
}

// Archiver is a server's WAL archiving, from pg_stat_archiver.
type Archiver struct {
	Mode            string     `json:"archive_mode"`
	Archived        int64      `json:"archived_count"`
	LastArchivedWAL string     `json:"last_archived_wal,omitempty"`
	LastArchivedAt  *time.Time `json:"last_archived_time,omitempty"`
	Failed          int64      `json:"failed_count"`
	LastFailedWAL   string     `json:"last_failed_wal,omitempty"`
	LastFailedAt    *time.Time `json:"last_failed_time,omitempty"`
	// FullPageWrites is the server's full_page_writes: a bucket restore
	// recovers one database and the others as zeroed files, which WAL
	// without full-page images cannot be replayed over.
	FullPageWrites string `json:"full_page_writes"`
}

// Failing: the last attempt to archive a segment failed (a later success
// clears it).
func (a *Archiver) Failing() bool {
	return a.LastFailedAt != nil && (a.LastArchivedAt == nil || a.LastFailedAt.After(*a.LastArchivedAt))
}

// ReadArchiver reads a server's archiving state.
func ReadArchiver(ctx context.Context, c *pgx.Conn) (*Archiver, error) {
	a := &Archiver{}
	err := c.QueryRow(ctx, `SELECT current_setting('archive_mode'), current_setting('full_page_writes'), archived_count, coalesce(last_archived_wal, ''), last_archived_time,
		failed_count, coalesce(last_failed_wal, ''), last_failed_time FROM pg_stat_archiver`).
		Scan(&a.Mode, &a.FullPageWrites, &a.Archived, &a.LastArchivedWAL, &a.LastArchivedAt, &a.Failed, &a.LastFailedWAL, &a.LastFailedAt)
	return a, err
}

// CheckNode reads node n's backups (through pgBackRest) and, if conn is
// not nil, its primary's archiving, and says what is wrong.
func CheckNode(ctx context.Context, pg PGBackRest, cfg *topo.BackupConfig, configured bool, n bucketmap.Node, conn *pgx.Conn, now time.Time) NodeStatus {
	ns := NodeStatus{Node: string(n.ID), Stanza: cfg.Stanzas[string(n.ID)], Configured: configured, Problems: []string{}}
	if conn != nil {
		a, err := ReadArchiver(ctx, conn)
		if err != nil {
			ns.Problems = append(ns.Problems, fmt.Sprintf("cannot read pg_stat_archiver: %v", err))
		} else {
			ns.Archiver = a
		}
	}
	if !configured {
		return ns
	}
	if ns.Stanza == "" {
		ns.Problems = append(ns.Problems, fmt.Sprintf("no backups configured for this node (shardctl backup configure %s --stanza NAME)", n.ID))
		return ns
	}
	if a := ns.Archiver; a != nil {
		switch {
		case a.Mode == "off":
			ns.Problems = append(ns.Problems, "archive_mode is off: no WAL is archived, so no point-in-time restore past the newest backup")
		case a.Failing():
			ns.Problems = append(ns.Problems, fmt.Sprintf("archiving is failing: %d failures, the last for %s at %s, after the last success (see the server's log; archive_command)",
				a.Failed, a.LastFailedWAL, a.LastFailedAt.UTC().Format(time.RFC3339)))
		}
		if a.FullPageWrites == "off" {
			ns.Problems = append(ns.Problems, "full_page_writes is off: a bucket restore's recovery of one database stops on WAL that touches the others (\"WAL contains references to invalid pages\"); set full_page_writes = on and reload")
		}
	}
	info, err := pg.Info(ctx, ns.Stanza)
	if err != nil {
		ns.Problems = append(ns.Problems, fmt.Sprintf("cannot read stanza %s: %v", ns.Stanza, err))
		return ns
	}
	ns.Backups, ns.WALMin, ns.WALMax = len(info.Backups), info.WALMin, info.WALMax
	newest := info.Newest()
	if newest == nil {
		ns.Problems = append(ns.Problems, fmt.Sprintf("no backup in stanza %s yet (shardctl backup %s)", ns.Stanza, n.ID))
		return ns
	}
	ns.Newest = newest
	age := now.Sub(newest.Stop)
	ns.AgeSeconds = age.Seconds()
	if limit := cfg.MaxAgeOrDefault(); age > limit {
		ns.Problems = append(ns.Problems, fmt.Sprintf("the newest backup (%s) is %s old, more than %s (shardctl backup %s)", newest.Label, age.Round(time.Minute), limit, n.ID))
	}
	return ns
}

// ArchiveNow switches the server to a new WAL segment and waits, up to
// wait, until the segment that holds everything written before the switch
// is in the archive: a recovery to a time just past, or to a point just
// cut, needs it there (recovery ends where the archive ends). It returns
// that segment's name.
func ArchiveNow(ctx context.Context, c *pgx.Conn, wait time.Duration) (string, error) {
	var seg string
	// pg_switch_wal returns the end of the segment it closed, plus one:
	// one byte back is in it. Nothing written since the last switch: no
	// switch, and the segment before is the one to wait for.
	if err := c.QueryRow(ctx, `SELECT pg_walfile_name(pg_switch_wal() - 1)`).Scan(&seg); err != nil {
		return "", err
	}
	deadline := time.Now().Add(wait)
	for {
		a, err := ReadArchiver(ctx, c)
		if err != nil {
			return seg, err
		}
		// Segment names sort by timeline, then position.
		if a.LastArchivedWAL >= seg && len(a.LastArchivedWAL) >= len(seg) {
			return seg, nil
		}
		if time.Now().After(deadline) {
			why := ""
			if a.Failing() {
				why = fmt.Sprintf(": archiving is failing (the last failure for %s)", a.LastFailedWAL)
			}
			return seg, fmt.Errorf("WAL segment %s not archived within %s (the last archived: %q)%s", seg, wait, a.LastArchivedWAL, why)
		}
		select {
		case <-ctx.Done():
			return seg, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
