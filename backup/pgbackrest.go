package backup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/shardvisor/shardvisor/hint"
)

// PGBackRest runs pgBackRest on the host that holds the repository (in
// production the repository host, which reaches each db host through
// pgBackRest's own TLS server or SSH; in the dev environment every server
// is local). shardvisor never writes the repository itself.
type PGBackRest struct {
	// Command is pgBackRest's command line, with whatever runs it as the
	// repository's owner in front ("runuser -u postgres -- pgbackrest"):
	// files it writes must stay that user's, since each server's
	// archive-push writes there too. Scratch servers are started with the
	// same prefix. Empty: "pgbackrest".
	Command []string
	// Config is the pgBackRest configuration file naming every stanza
	// ("": pgBackRest's default, /etc/pgbackrest/pgbackrest.conf).
	Config string
	// LockWait bounds the wait for another pgBackRest process holding the
	// stanza's lock (a backup from another host's timer, a check): pgBackRest
	// itself gives up at once (error 50). 0: DefaultLockWait.
	LockWait time.Duration
}

// DefaultLockWait is how long a command waits for a stanza's lock.
const DefaultLockWait = 10 * time.Minute

// errLocked is pgBackRest's "unable to acquire lock" (error 50).
const errLocked = "ERROR: [050]"

// ErrPGBackRest is a pgBackRest command that failed.
var ErrPGBackRest = errors.New("pgbackrest failed")

func (b PGBackRest) command() []string {
	if len(b.Command) == 0 {
		return []string{"pgbackrest"}
	}
	return b.Command
}

// prefix is what Command puts in front of pgbackrest (runuser ...), for
// the scratch servers' commands.
func (b PGBackRest) prefix() []string {
	c := b.command()
	return c[:len(c)-1]
}

// run runs pgbackrest COMMAND for stanza with args and returns its
// standard output, waiting (up to LockWait, with backoff) while another
// pgBackRest process holds the stanza's lock. The error holds the tail of
// what it printed.
func (b PGBackRest) run(ctx context.Context, stanza, command string, args ...string) ([]byte, error) {
	wait := b.LockWait
	if wait <= 0 {
		wait = DefaultLockWait
	}
	deadline := time.Now().Add(wait)
	for pause := 200 * time.Millisecond; ; pause = min(2*pause, 5*time.Second) {
		out, err := b.runOnce(ctx, stanza, command, args...)
		if err == nil || !strings.Contains(err.Error(), errLocked) || time.Now().After(deadline) {
			if err != nil && strings.Contains(err.Error(), errLocked) {
				err = hint.New(fmt.Errorf("%w (waited %s for the stanza's lock)", err, wait), "another pgBackRest process holds stanza "+stanza+": ps -ef | grep pgbackrest on the repository host")
			}
			return out, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pause):
		}
	}
}

func (b PGBackRest) runOnce(ctx context.Context, stanza, command string, args ...string) ([]byte, error) {
	c := b.command()
	argv := append([]string{}, c[1:]...)
	if b.Config != "" {
		argv = append(argv, "--config="+b.Config)
	}
	if stanza != "" {
		argv = append(argv, "--stanza="+stanza)
	}
	argv = append(argv, "--log-level-console=warn", "--log-level-stderr=off")
	argv = append(argv, args...)
	argv = append(argv, command)
	cmd := exec.CommandContext(ctx, c[0], argv...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String() + "\n" + out.String())
		if len(msg) > 600 {
			msg = "..." + msg[len(msg)-600:]
		}
		if errors.Is(err, exec.ErrNotFound) {
			return nil, hint.New(fmt.Errorf("%w: %s is not installed: %v", ErrPGBackRest, c[0], err),
				"install pgBackRest (Debian: apt-get install pgbackrest) or point --pgbackrest (SHARDVISOR_PGBACKREST) at it")
		}
		return nil, fmt.Errorf("%w: %s (stanza %s): %v: %s", ErrPGBackRest, command, stanza, err, msg)
	}
	return out.Bytes(), nil
}

// Backup types.
const (
	Full = "full"
	Diff = "diff"
	Incr = "incr"
)

// Backup takes a backup of stanza (full, diff or incr; an incremental
// backup without a full one before it is taken full by pgBackRest) and
// returns the stanza's backups afterwards.
func (b PGBackRest) Backup(ctx context.Context, stanza, typ string) (*StanzaInfo, error) {
	switch typ {
	case Full, Diff, Incr:
	default:
		return nil, fmt.Errorf("backup type %q is not full, diff or incr", typ)
	}
	if _, err := b.run(ctx, stanza, "backup", "--type="+typ); err != nil {
		return nil, err
	}
	return b.Info(ctx, stanza)
}

// StanzaCreate creates stanza's directories in the repository
// (idempotent).
func (b PGBackRest) StanzaCreate(ctx context.Context, stanza string) error {
	_, err := b.run(ctx, stanza, "stanza-create")
	return err
}

// Check asks pgBackRest to check stanza: the server's archive_command
// works (it forces a WAL switch and waits for the segment in the
// repository) and the repository is sound.
func (b PGBackRest) Check(ctx context.Context, stanza string) error {
	_, err := b.run(ctx, stanza, "check")
	return err
}

// StanzaInfo is what pgBackRest knows of a stanza: its backups, oldest
// first, and the WAL it has archived.
type StanzaInfo struct {
	Stanza  string       `json:"stanza"`
	Status  string       `json:"status"` // pgBackRest's message: "ok", "no valid backups", ...
	Code    int          `json:"status_code"`
	Backups []BackupInfo `json:"backups"`
	// WALMin and WALMax are the oldest and newest WAL segments archived.
	WALMin string `json:"wal_min,omitempty"`
	WALMax string `json:"wal_max,omitempty"`
}

// BackupInfo is one backup.
type BackupInfo struct {
	Label string    `json:"label"`
	Type  string    `json:"type"`
	Start time.Time `json:"start"`
	Stop  time.Time `json:"stop"`
	// The WAL a restore of it needs at least (start..stop), and its LSNs.
	WALStart string `json:"wal_start"`
	WALStop  string `json:"wal_stop"`
	LSNStart string `json:"lsn_start"`
	LSNStop  string `json:"lsn_stop"`
	// Size is the database's size; RepoSize what the backup takes in the
	// repository (compressed, and only the changed files when incremental).
	Size     int64 `json:"size"`
	RepoSize int64 `json:"repo_size"`
	// Prior is the backup an incremental or differential one builds on.
	Prior string `json:"prior,omitempty"`
	Error bool   `json:"error,omitempty"`
}

// Newest is the newest backup without error, or nil.
func (s *StanzaInfo) Newest() *BackupInfo {
	for i := len(s.Backups) - 1; i >= 0; i-- {
		if !s.Backups[i].Error {
			return &s.Backups[i]
		}
	}
	return nil
}

// Info reads stanza's backups (pgbackrest info --output=json).
func (b PGBackRest) Info(ctx context.Context, stanza string) (*StanzaInfo, error) {
	out, err := b.run(ctx, stanza, "info", "--output=json")
	if err != nil {
		return nil, err
	}
	return parseInfo(stanza, out)
}

// parseInfo reads pgBackRest 2.x's `info --output=json` for one stanza.
func parseInfo(stanza string, out []byte) (*StanzaInfo, error) {
	var raw []struct {
		Name    string `json:"name"`
		Archive []struct {
			Min string `json:"min"`
			Max string `json:"max"`
		} `json:"archive"`
		Backup []struct {
			Archive struct {
				Start string `json:"start"`
				Stop  string `json:"stop"`
			} `json:"archive"`
			Error *bool `json:"error"`
			Info  struct {
				Size       int64 `json:"size"`
				Repository struct {
					Delta int64 `json:"delta"`
				} `json:"repository"`
			} `json:"info"`
			Label string `json:"label"`
			LSN   struct {
				Start string `json:"start"`
				Stop  string `json:"stop"`
			} `json:"lsn"`
			Prior     *string `json:"prior"`
			Timestamp struct {
				Start int64 `json:"start"`
				Stop  int64 `json:"stop"`
			} `json:"timestamp"`
			Type string `json:"type"`
		} `json:"backup"`
		Status struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"status"`
	}
	if err := json.Unmarshal(out, &raw); err != nil {
		return nil, fmt.Errorf("%w: info for stanza %s is not the JSON pgBackRest 2.x prints: %v", ErrPGBackRest, stanza, err)
	}
	for _, r := range raw {
		if r.Name != stanza {
			continue
		}
		si := &StanzaInfo{Stanza: stanza, Status: r.Status.Message, Code: r.Status.Code, Backups: []BackupInfo{}}
		for _, a := range r.Archive {
			if si.WALMin == "" || a.Min < si.WALMin {
				si.WALMin = a.Min
			}
			if a.Max > si.WALMax {
				si.WALMax = a.Max
			}
		}
		for _, bk := range r.Backup {
			bi := BackupInfo{
				Label: bk.Label, Type: bk.Type,
				Start: time.Unix(bk.Timestamp.Start, 0).UTC(), Stop: time.Unix(bk.Timestamp.Stop, 0).UTC(),
				WALStart: bk.Archive.Start, WALStop: bk.Archive.Stop, LSNStart: bk.LSN.Start, LSNStop: bk.LSN.Stop,
				Size: bk.Info.Size, RepoSize: bk.Info.Repository.Delta, Error: bk.Error != nil && *bk.Error,
			}
			if bk.Prior != nil {
				bi.Prior = *bk.Prior
			}
			si.Backups = append(si.Backups, bi)
		}
		return si, nil
	}
	return nil, fmt.Errorf("%w: info has no stanza %s", ErrPGBackRest, stanza)
}

// Target is what a recovery stops at: a named restore point (the WAL
// name, RestorePoint.WALName) or a time. LSN is the point's LSN on the
// server recovered (RestorePoint.Nodes[id].LSN), for choosing the backup.
type Target struct {
	Name string
	LSN  string
	Time time.Time
}

func (t Target) String() string {
	if t.Name != "" {
		return "restore point " + t.Name
	}
	return t.Time.UTC().Format(time.RFC3339Nano)
}

// restoreArgs are pgbackrest restore's options for recovering stanza's
// server into dir from backup set (its label; "": pgBackRest's choice),
// stopping at t and promoting there. Archiving is off in the recovered
// server (it must never push its new timeline into the stanza's archive);
// dbs, when given, are the only databases restored (the others come back
// as empty files PostgreSQL cannot open).
func restoreArgs(dir, set string, t Target, dbs []string) []string {
	args := []string{"--pg1-path=" + dir, "--target-action=promote", "--archive-mode=off", "--delta=n"}
	if set != "" {
		args = append(args, "--set="+set)
	}
	if t.Name != "" {
		args = append(args, "--type=name", "--target="+t.Name)
	} else {
		args = append(args, "--type=time", "--target="+t.Time.UTC().Format("2006-01-02 15:04:05.999999")+"+00")
	}
	for _, d := range dbs {
		args = append(args, "--db-include="+d)
	}
	return args
}

// Restore recovers stanza's server into the empty directory dir, up to t,
// from the newest backup that ends before t (ChooseSet).
func (b PGBackRest) Restore(ctx context.Context, stanza, dir string, t Target, dbs []string) error {
	info, err := b.Info(ctx, stanza)
	if err != nil {
		return err
	}
	set, err := ChooseSet(info, t)
	if err != nil {
		return err
	}
	_, err = b.run(ctx, stanza, "restore", restoreArgs(dir, set, t, dbs)...)
	return err
}

// ErrNoBackupBefore means no backup of the stanza ends before the target:
// nothing can be recovered to it.
var ErrNoBackupBefore = errors.New("no backup ends before the target")

// ChooseSet picks the backup a recovery to t starts from: the newest good
// one that ended before t (its stop LSN at or before the point's LSN, or
// its stop time before the time). pgBackRest's own choice is its newest
// backup, which for a point taken before it ends the recovery before the
// target ("recovery ended before configured recovery target was
// reached").
func ChooseSet(info *StanzaInfo, t Target) (string, error) {
	var pointLSN uint64
	if t.Name != "" {
		if t.LSN == "" {
			return "", nil // no LSN known: pgBackRest's choice
		}
		var err error
		if pointLSN, err = ParseLSN(t.LSN); err != nil {
			return "", err
		}
	}
	for i := len(info.Backups) - 1; i >= 0; i-- {
		bk := info.Backups[i]
		if bk.Error {
			continue
		}
		if t.Name != "" {
			stop, err := ParseLSN(bk.LSNStop)
			if err == nil && stop <= pointLSN {
				return bk.Label, nil
			}
			continue
		}
		if bk.Stop.Before(t.Time) {
			return bk.Label, nil
		}
	}
	return "", hint.New(fmt.Errorf("stanza %s: %w (%s)", info.Stanza, ErrNoBackupBefore, t), "shardctl backup list shows the backups; a restore needs one taken before its target")
}

// ParseLSN reads PostgreSQL's X/Y form of a WAL position.
func ParseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%q is not an LSN (X/Y)", s)
	}
	return h<<32 | l, nil
}
