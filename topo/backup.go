package topo

import (
	"context"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"time"

	"github.com/shardvisor/shardvisor/zksession"
)

// Backups in ZooKeeper (package backup takes them with pgBackRest):
//
//	<cluster>/backup                   BackupConfig: each node's pgBackRest
//	                                   stanza, how old a backup may get
//	<cluster>/backup/points/<name>     RestorePoint: a cluster restore point
//	<cluster>/backup/points/<name>/map the bucket map record at the point,
//	                                   as stored (plain or gzip)
//	<cluster>/backup/restores/<id>     BucketRestore: a bucket restore
//	<cluster>/locks/backup             ephemeral: a restore point is being
//	                                   cut, or the scheduler that cuts them

// BackupConfigVersion, RestorePointVersion and BucketRestoreVersion are the
// newest formats of the backup records.
const (
	BackupConfigVersion  = 1
	RestorePointVersion  = 1
	BucketRestoreVersion = 1
)

// Backup returns the backup configuration record, the parent of the rest.
func (p Paths) Backup() string { return path.Join(p.Cluster(), "backup") }

// RestorePoints returns the directory of the cluster's restore points.
func (p Paths) RestorePoints() string { return path.Join(p.Backup(), "points") }

// RestorePoint returns restore point name's record.
func (p Paths) RestorePoint(name string) string { return path.Join(p.RestorePoints(), name) }

// RestorePointMap returns the map record kept with restore point name.
func (p Paths) RestorePointMap(name string) string { return path.Join(p.RestorePoint(name), "map") }

// BucketRestores returns the directory of bucket restores.
func (p Paths) BucketRestores() string { return path.Join(p.Backup(), "restores") }

// BucketRestorePath returns bucket restore id's record.
func (p Paths) BucketRestorePath(id string) string { return path.Join(p.BucketRestores(), id) }

// BackupLock returns the lock held while a restore point is cut (and by the
// elected scheduler of `restore-point watch`, between its points).
func (p Paths) BackupLock() string { return p.Lock("backup") }

// DefaultBackupMaxAge is how old a node's newest backup may be before
// `node check` calls it a problem, when BackupConfig says nothing.
const DefaultBackupMaxAge = 26 * time.Hour

// BackupConfig is the cluster's backup configuration: where each db node's
// backups are (its pgBackRest stanza, in the repository named by the
// admin host's pgBackRest configuration) and what counts as recent.
type BackupConfig struct {
	Version int `json:"version"`
	// Stanzas maps a node id to its pgBackRest stanza. A node not in it
	// has no backups configured (a problem for `node check`).
	Stanzas map[string]string `json:"stanzas"`
	// MaxAge: a newest backup older than this is a problem ("26h"; ""
	// means DefaultBackupMaxAge).
	MaxAge string `json:"max_age,omitempty"`
}

// MaxAgeOrDefault is MaxAge parsed, or DefaultBackupMaxAge.
func (c *BackupConfig) MaxAgeOrDefault() time.Duration {
	if c == nil || c.MaxAge == "" {
		return DefaultBackupMaxAge
	}
	d, err := time.ParseDuration(c.MaxAge)
	if err != nil {
		return DefaultBackupMaxAge
	}
	return d
}

var stanzaRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// ValidStanza checks a pgBackRest stanza name (a safe file name too).
func ValidStanza(s string) error {
	if !stanzaRE.MatchString(s) {
		return fmt.Errorf("stanza %q is invalid: use 1-64 of A-Z, a-z, 0-9, '.', '_' and '-', starting with a letter or digit", s)
	}
	return nil
}

// DecodeBackupConfig decodes the backup configuration strictly.
func DecodeBackupConfig(znode string, data []byte) (*BackupConfig, error) {
	return decodeAs("backup configuration", znode, data, BackupConfigVersion, func(c *BackupConfig) error {
		for n, s := range c.Stanzas {
			if err := ValidStanza(s); err != nil {
				return fmt.Errorf("node %s: %w", n, err)
			}
		}
		if c.MaxAge != "" {
			if d, err := time.ParseDuration(c.MaxAge); err != nil || d <= 0 {
				return fmt.Errorf("max_age %q is not a positive duration", c.MaxAge)
			}
		}
		return nil
	})
}

// ReadBackupConfig reads the backup configuration with its znode version
// (-1: no znode). A cluster without one (no znode, or the empty directory
// a restore point's parent left) gets an empty configuration whose
// Version is 0: backups were never configured.
func ReadBackupConfig(ctx context.Context, s *zksession.Session, p Paths) (*BackupConfig, int32, error) {
	data, st, err := s.Get(ctx, p.Backup())
	if errors.Is(err, zksession.ErrNoNode) {
		return &BackupConfig{Stanzas: map[string]string{}}, -1, nil
	}
	if err != nil {
		return nil, 0, err
	}
	if len(data) == 0 {
		return &BackupConfig{Stanzas: map[string]string{}}, st.Version, nil
	}
	c, err := DecodeBackupConfig(p.Backup(), data)
	if err != nil {
		return nil, 0, err
	}
	if c.Stanzas == nil {
		c.Stanzas = map[string]string{}
	}
	return c, st.Version, nil
}

// Configured says whether the cluster has a backup configuration.
func (c *BackupConfig) Configured() bool { return c != nil && c.Version > 0 }

// UpdateBackupConfig applies edit to the configuration and writes it by
// compare-and-swap, re-reading and re-applying edit when another writer
// got there first (up to 5 times).
func UpdateBackupConfig(ctx context.Context, s *zksession.Session, p Paths, edit func(*BackupConfig) error) (*BackupConfig, error) {
	for attempt := 0; ; attempt++ {
		c, v, err := ReadBackupConfig(ctx, s, p)
		if err != nil {
			return nil, err
		}
		if err := edit(c); err != nil {
			return nil, err
		}
		c.Version = BackupConfigVersion
		data, err := EncodeCompact(c)
		if err != nil {
			return nil, err
		}
		if v < 0 {
			err = createNode(ctx, s, p, p.Backup(), data)
			if errors.Is(err, zksession.ErrNodeExists) && attempt < 5 {
				continue
			}
			return c, err
		}
		if _, err = s.Set(ctx, p.Backup(), data, v); errors.Is(err, zksession.ErrBadVersion) && attempt < 5 {
			continue
		}
		return c, err
	}
}

var pointNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$`)

// ValidPointName checks a restore point's name: 1-48 of letters, digits,
// '.', '_' and '-', starting with a letter or digit (a safe znode name;
// PostgreSQL keeps the WAL name, the name and a time, in 63 bytes).
func ValidPointName(name string) error {
	if !pointNameRE.MatchString(name) {
		return fmt.Errorf("restore point name %q is invalid: use 1-48 of A-Z, a-z, 0-9, '.', '_' and '-', starting with a letter or digit", name)
	}
	return nil
}

// RestorePoint is one cluster restore point: a named WAL record
// (pg_create_restore_point) on every db node's primary, cut while the map
// stayed at MapVersion, with what a restore needs to know of the cluster
// then.
type RestorePoint struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	// WALName is the name of the WAL records (backup.WALName): unique,
	// what a recovery to the point stops at.
	WALName string    `json:"wal_name"`
	At      time.Time `json:"at"`
	By      string    `json:"by"`
	// Reason: "manual", "schedule", "before schema change ID",
	// "before rebalance".
	Reason string `json:"reason"`
	// MapVersion is the map's version at the cut; the map record itself is
	// kept beside (Paths.RestorePointMap).
	MapVersion uint64 `json:"map_version"`
	// Moves are the moves in flight at the cut: after a whole-cluster
	// restore each is rolled back to its source (the map at the point
	// names the source as owner).
	Moves []PointMove `json:"moves,omitempty"`
	// Nodes: each node's point, by node id.
	Nodes map[string]PointNode `json:"nodes"`
	// CutMS is how long the cut took, from the first node's point to the
	// last; Attempts counts the cuts tried (a map change during one
	// voids it).
	CutMS    float64 `json:"cut_ms"`
	Attempts int     `json:"attempts"`
}

// PointMove is a move in flight at a restore point, with its key range
// and the replication objects a whole-cluster restore tears down on the
// recovered servers (their names are in the move record, which may be
// gone by then).
type PointMove struct {
	ID     string `json:"id"`
	Bucket string `json:"bucket"`
	Lo     int64  `json:"lo"`
	Hi     int64  `json:"hi"`
	Source string `json:"source"`
	Target string `json:"target"`
	State  string `json:"state"`
	// The forward stream: publication and slot on the source,
	// subscription on the target.
	Publication  string `json:"publication,omitempty"`
	Slot         string `json:"slot,omitempty"`
	Subscription string `json:"subscription,omitempty"`
	// The reverse stream, past the flip: publication and slot on the
	// target, subscription on the source.
	ReversePublication  string `json:"reverse_publication,omitempty"`
	ReverseSlot         string `json:"reverse_slot,omitempty"`
	ReverseSubscription string `json:"reverse_subscription,omitempty"`
}

// PointNode is a restore point on one node.
type PointNode struct {
	// Stanza is the node's pgBackRest stanza at the point ("" when the
	// node had no backups configured: it can still be recovered from a
	// base backup taken by other means).
	Stanza string `json:"stanza,omitempty"`
	// LSN is where pg_create_restore_point wrote the point; Timeline the
	// primary's timeline then; Server the primary (host:port).
	LSN      string `json:"lsn"`
	Timeline int    `json:"timeline"`
	Server   string `json:"server"`
	// FenceVersion is the map version the node's fence was synced to.
	FenceVersion uint64 `json:"fence_version"`
	// Archived: the WAL segment holding the point was in the archive when
	// the point was recorded (false: a recovery to it may end before it
	// until archiving catches up).
	Archived bool `json:"archived"`
}

// DecodeRestorePoint decodes a restore point strictly.
func DecodeRestorePoint(znode string, data []byte) (*RestorePoint, error) {
	return decodeAs("restore point", znode, data, RestorePointVersion, func(r *RestorePoint) error {
		if err := ValidPointName(r.Name); err != nil {
			return err
		}
		if r.At.IsZero() {
			return errors.New("no time")
		}
		if r.WALName == "" || len(r.WALName) > 63 {
			return fmt.Errorf("wal_name %q is empty or longer than 63 bytes", r.WALName)
		}
		if len(r.Nodes) == 0 {
			return errors.New("no nodes")
		}
		for n, pn := range r.Nodes {
			if pn.LSN == "" {
				return fmt.Errorf("node %s has no LSN", n)
			}
		}
		return nil
	})
}

// ErrPointExists means a restore point of that name exists.
var ErrPointExists = errors.New("a restore point of that name exists")

// CreateRestorePoint writes a restore point and its map record in one
// transaction.
func CreateRestorePoint(ctx context.Context, s *zksession.Session, p Paths, r *RestorePoint, mapData []byte) error {
	data, err := EncodeCompact(r)
	if err != nil {
		return err
	}
	if err := createDir(ctx, s, p, p.RestorePoints()); err != nil {
		return err
	}
	rule, err := ReadACLRule(ctx, s, p)
	if err != nil {
		return err
	}
	err = createTogether(ctx, s, p, rule, newNode{p.RestorePoint(r.Name), data}, newNode{p.RestorePointMap(r.Name), mapData})
	if errors.Is(err, zksession.ErrNodeExists) {
		return fmt.Errorf("%w: %s", ErrPointExists, r.Name)
	}
	return err
}

// ReadRestorePoint reads restore point name.
func ReadRestorePoint(ctx context.Context, s *zksession.Session, p Paths, name string) (*RestorePoint, error) {
	r, _, err := readAs(ctx, s, p.RestorePoint(name), DecodeRestorePoint)
	return r, err
}

// ReadRestorePointMap reads the map record kept with restore point name,
// as stored.
func ReadRestorePointMap(ctx context.Context, s *zksession.Session, p Paths, name string) ([]byte, error) {
	data, _, err := s.Get(ctx, p.RestorePointMap(name))
	return data, err
}

// ListRestorePoints reads every restore point, oldest first. A record that
// does not decode fails the list, naming it.
func ListRestorePoints(ctx context.Context, s *zksession.Session, p Paths) ([]*RestorePoint, error) {
	names, _, err := s.Children(ctx, p.RestorePoints())
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]*RestorePoint, 0, len(names))
	for _, n := range names {
		r, err := ReadRestorePoint(ctx, s, p, n)
		if errors.Is(err, zksession.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *RestorePoint) int { return a.At.Compare(b.At) })
	return out, nil
}

// DeleteRestorePoint deletes a restore point and its map (the WAL record
// stays in the archive; only the cluster forgets it).
func DeleteRestorePoint(ctx context.Context, s *zksession.Session, p Paths, name string) error {
	if err := s.Delete(ctx, p.RestorePointMap(name), -1); err != nil && !errors.Is(err, zksession.ErrNoNode) {
		return err
	}
	return s.Delete(ctx, p.RestorePoint(name), -1)
}

// LockBackup takes the backup lock (Paths.BackupLock), waiting for it as
// zksession.Lock does.
func LockBackup(ctx context.Context, s *zksession.Session, p Paths, holder []byte, onWait func(*zksession.LockedError)) (*zksession.Lock, error) {
	return waitLock(ctx, s, p, p.BackupLock(), holder, onWait)
}

// Bucket restore states.
const (
	RestorePlanned  = "planned"
	RestoreRecover  = "recover"
	RestoreStage    = "stage"
	RestoreApply    = "apply"
	RestoreDone     = "done"
	RestoreFailed   = "failed"
	RestoreDryRun   = "dry_run"
	RestoreModeFull = "replace"
	RestoreModeMiss = "missing"
)

// BucketRestore records one bucket restore: what was asked, where it came
// from and how far it got. The data path leaves nothing that serves
// writes half done (the apply is one transaction per node); the record is
// for people and for the scratch servers a crash left behind.
type BucketRestore struct {
	Version int       `json:"version"`
	ID      string    `json:"id"`
	Bucket  string    `json:"bucket"`
	User    string    `json:"user,omitempty"` // one user's rows only
	Lo      int64     `json:"lo"`
	Hi      int64     `json:"hi"`
	Mode    string    `json:"mode"`
	Point   string    `json:"point,omitempty"`
	Time    time.Time `json:"time,omitempty"`
	DryRun  bool      `json:"dry_run,omitempty"`
	Tables  []string  `json:"tables,omitempty"`
	State   string    `json:"state"`
	Error   string    `json:"error,omitempty"`
	By      string    `json:"by"`
	At      time.Time `json:"at"`
	// Scratch lists the scratch servers' directories, so that a crashed
	// restore's are found and removed.
	Scratch []string `json:"scratch,omitempty"`
	// Result is the restore's outcome, as `shardctl restore --json` prints
	// it.
	Result map[string]any `json:"result,omitempty"`
}

// DecodeBucketRestore decodes a bucket restore record strictly.
func DecodeBucketRestore(znode string, data []byte) (*BucketRestore, error) {
	return decodeAs("bucket restore", znode, data, BucketRestoreVersion, func(r *BucketRestore) error {
		if r.ID == "" || r.Bucket == "" {
			return errors.New("no id or bucket")
		}
		if r.Mode != RestoreModeFull && r.Mode != RestoreModeMiss {
			return fmt.Errorf("mode %q is not %q or %q", r.Mode, RestoreModeFull, RestoreModeMiss)
		}
		return nil
	})
}

// WriteBucketRestore creates or overwrites a bucket restore's record
// (one writer: the restore that made it).
func WriteBucketRestore(ctx context.Context, s *zksession.Session, p Paths, r *BucketRestore) error {
	r.Version = BucketRestoreVersion
	data, err := EncodeCompact(r)
	if err != nil {
		return err
	}
	_, err = s.Set(ctx, p.BucketRestorePath(r.ID), data, -1)
	if errors.Is(err, zksession.ErrNoNode) {
		err = createNode(ctx, s, p, p.BucketRestorePath(r.ID), data)
	}
	return err
}

// ListBucketRestores reads every bucket restore record, oldest first.
func ListBucketRestores(ctx context.Context, s *zksession.Session, p Paths) ([]*BucketRestore, error) {
	ids, _, err := s.Children(ctx, p.BucketRestores())
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*BucketRestore
	for _, id := range ids {
		r, _, err := readAs(ctx, s, p.BucketRestorePath(id), DecodeBucketRestore)
		if errors.Is(err, zksession.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *BucketRestore) int { return a.At.Compare(b.At) })
	return out, nil
}

// BackupStatusVersion is the newest backup status record format.
const BackupStatusVersion = 1

// BackupStatusPath is the record the backup watcher writes after each
// check: what the status page shows of backups (web heads cannot ask
// pgBackRest: the repository is not theirs).
func (p Paths) BackupStatusPath() string { return path.Join(p.Backup(), "status") }

// BackupStatus is the last check of every node's backups.
type BackupStatus struct {
	Version int                `json:"version"`
	At      time.Time          `json:"at"`
	By      string             `json:"by"`
	Nodes   []BackupNodeStatus `json:"nodes"`
}

// BackupNodeStatus is one node's part of BackupStatus.
type BackupNodeStatus struct {
	Node     string     `json:"node"`
	Stanza   string     `json:"stanza,omitempty"`
	NewestAt *time.Time `json:"newest_at,omitempty"`
	Problems []string   `json:"problems,omitempty"`
}

// DecodeBackupStatus decodes a backup status record strictly.
func DecodeBackupStatus(znode string, data []byte) (*BackupStatus, error) {
	return decodeAs("backup status", znode, data, BackupStatusVersion, func(r *BackupStatus) error {
		if r.At.IsZero() {
			return errors.New("no time")
		}
		return nil
	})
}

// WriteBackupStatus writes the status record (last writer wins: one
// watcher per cluster).
func WriteBackupStatus(ctx context.Context, s *zksession.Session, p Paths, r *BackupStatus) error {
	r.Version = BackupStatusVersion
	data, err := EncodeCompact(r)
	if err != nil {
		return err
	}
	_, err = s.Set(ctx, p.BackupStatusPath(), data, -1)
	if errors.Is(err, zksession.ErrNoNode) {
		err = createNode(ctx, s, p, p.BackupStatusPath(), data)
	}
	return err
}

// ReadBackupStatus reads the status record; nil, nil when there is none
// (no watcher has checked yet).
func ReadBackupStatus(ctx context.Context, s *zksession.Session, p Paths) (*BackupStatus, error) {
	r, _, err := readAs(ctx, s, p.BackupStatusPath(), DecodeBackupStatus)
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, nil
	}
	return r, err
}
