package devenv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// pgBackRest: every db server archives its WAL continuously into one
// repository, DIR/backup/repo, with a stanza per node (pgI): a plain
// node's server, or every member of a group (pgBackRest finds the primary
// among them). archive_command runs pgbackrest archive-push as the
// server's user (postgres); up writes the configuration, DIR/backup/
// pgbackrest.conf, the one a repository host has, and runs stanza-create
// for each node once it is healthy. Backups and restores are run by
// whoever reads BackupConfig and PGBackRestCommand. No pgBackRest daemon
// runs (archive-async is off): down has nothing to stop.

const (
	pgbackrestBin = "/usr/bin/pgbackrest"
	runuserBin    = "/usr/sbin/runuser"
)

// BackupDir is pgBackRest's directory: pgbackrest.conf, repo/ (the
// repository), log/, lock/ and spool/, all the postgres user's.
func (e *Env) BackupDir() string { return filepath.Join(e.c.Dir, "backup") }

// BackupConfig is the pgBackRest configuration of the environment's
// repository (a repository host's: it names every node's servers).
func (e *Env) BackupConfig() string { return filepath.Join(e.BackupDir(), "pgbackrest.conf") }

// Stanza is node i's pgBackRest stanza: "pgI".
func (e *Env) Stanza(i int) string { return "pg" + itoa(i) }

// PGBackRestCommand is what to exec to run pgbackrest on the repository
// (its arguments follow: --config=BackupConfig() --stanza=... backup):
// as root, pgbackrest as the postgres user, who owns the repository and
// whose archive-push writes to it; else pgbackrest as this user, who
// runs the servers.
func (e *Env) PGBackRestCommand() []string {
	if isRoot() {
		return []string{runuserBin, "-u", pgUser, "--", pgbackrestBin}
	}
	return []string{pgbackrestBin}
}

// ArchiveTimeout is every server's archive_timeout: a quiet server's
// last writes reach the repository at most this long after they commit
// (a busy one's sooner, when its 16 MB segment fills). It bounds the RPO
// of a restore from the repository. Each switch archives a whole segment,
// mostly zeros, ~70 KB in lz4; a server with no WAL since its last switch
// does not switch.
const ArchiveTimeout = "60s"

// archiveCommand is the archive_command of the server whose data
// directory is data, in node i: archive-push with its own data directory
// as pg1-path, whatever the stanza lists first (PostgreSQL gives %p
// relative to it; a group's members each have their own).
func (e *Env) archiveCommand(i int, data string) string {
	return fmt.Sprintf("%s --config=%s --stanza=%s --pg1-path=%s archive-push %%p", pgbackrestBin, e.BackupConfig(), e.Stanza(i), data)
}

type pgbrServer struct {
	N            int // its pgN index in the stanza
	Data, Socket string
	Port         int
}

type pgbrStanza struct {
	Name    string
	Servers []pgbrServer
}

// stanzaNodes are the nodes the configuration has a stanza for: those up
// deals with, and any other that exists (it may run, and archive).
func (e *Env) stanzaNodes() []int {
	var out []int
	for i := 1; i <= max(e.NodeCount(), e.existingNodes()); i++ {
		out = append(out, i)
	}
	return out
}

// pgbackrestConf is DIR/backup/pgbackrest.conf.
func (e *Env) pgbackrestConf() []byte {
	d := struct {
		Repo, Log, Lock, Spool string
		Stanzas                []pgbrStanza
	}{filepath.Join(e.BackupDir(), "repo"), filepath.Join(e.BackupDir(), "log"), filepath.Join(e.BackupDir(), "lock"), filepath.Join(e.BackupDir(), "spool"), nil}
	for _, i := range e.stanzaNodes() {
		n, err := e.Members(i)
		if err != nil {
			continue // a broken members file: up reports it
		}
		s := pgbrStanza{Name: e.Stanza(i)}
		if n == 1 {
			s.Servers = []pgbrServer{{1, e.pgData(i), e.PGDir(i), e.PGPort(i)}}
		}
		for m := 1; n > 1 && m <= n; m++ {
			s.Servers = append(s.Servers, pgbrServer{m, filepath.Join(e.MemberDir(i, m), "data"), e.MemberDir(i, m), e.MemberPort(i, m)})
		}
		d.Stanzas = append(d.Stanzas, s)
	}
	return render("pgbackrest.conf", d)
}

// ensureBackup makes pgBackRest's directories (the postgres user's: its
// archive-push writes there) and writes its configuration anew.
func (e *Env) ensureBackup() error {
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{e.BackupDir(), 0o750}, {filepath.Join(e.BackupDir(), "repo"), 0o750}, {filepath.Join(e.BackupDir(), "log"), 0o750},
		{filepath.Join(e.BackupDir(), "lock"), 0o700}, {filepath.Join(e.BackupDir(), "spool"), 0o750}} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return err
		}
		_ = os.Chmod(d.path, d.mode)
		if err := chownPG(d.path); err != nil {
			return err
		}
	}
	// A rename: an archive-push running now reads the old file or the new.
	tmp := filepath.Join(e.BackupDir(), ".pgbackrest.conf.tmp")
	if err := writePGFile(tmp, e.pgbackrestConf(), 0o640); err != nil {
		return err
	}
	return os.Rename(tmp, e.BackupConfig())
}

// runPGBackRest runs a pgbackrest command line as the postgres user and
// returns its output (warnings and errors: the console logs at warn).
func (e *Env) runPGBackRest(args []string) (string, error) {
	cmd := exec.Command(args[0], args[1:]...)
	if err := asPG(cmd); err != nil {
		return "", err
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

// stanzaLog is the log file of a pgbackrest command on node i's stanza.
func (e *Env) stanzaLog(i int, command string) string {
	return filepath.Join(e.BackupDir(), "log", e.Stanza(i)+"-"+command+".log")
}

// stanzaCreateArgs is pgbackrest stanza-create's command line for node i.
func (e *Env) stanzaCreateArgs(i int, opts ...string) []string {
	return append(append([]string{pgbackrestBin, "--config=" + e.BackupConfig(), "--stanza=" + e.Stanza(i)}, opts...), "stanza-create")
}

// stanzaCreate creates node i's stanza in the repository, or checks that
// the one there is of the node's database (pgBackRest's stanza-create is
// idempotent). It connects to the node's servers (a group's primary must
// run). A stanza of another database (the node's directory was removed,
// and up made it anew: another system identifier) is upgraded to this
// one: the database before stays in the stanza's history, its backups
// and WAL with it, and this one's archive-push, which fails until then,
// is taken.
func (e *Env) stanzaCreate(i int) error {
	out, err := e.runPGBackRest(e.stanzaCreateArgs(i))
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == pgbrBackupMismatch && strings.Contains(out, "do not match the database") {
		e.logf("pg%d: the repository's stanza %s is of another database (the node was made anew); pgbackrest stanza-upgrade: the one before stays in its history", i, e.Stanza(i))
		args := []string{pgbackrestBin, "--config=" + e.BackupConfig(), "--stanza=" + e.Stanza(i), "stanza-upgrade"}
		if out, err = e.runPGBackRest(args); err == nil {
			return nil
		}
		return fmt.Errorf("pg%d: pgbackrest stanza-upgrade --stanza=%s failed (%v): %s\n    (log: %s)", i, e.Stanza(i), err, out, e.stanzaLog(i, "stanza-upgrade"))
	}
	return fmt.Errorf("pg%d: pgbackrest stanza-create --stanza=%s failed (%v): %s\n    (log: %s)", i, e.Stanza(i), err, out, e.stanzaLog(i, "stanza-create"))
}

// pgbrBackupMismatch is pgBackRest's exit code (and error number) for
// "backup and archive info files exist but do not match the database".
const pgbrBackupMismatch = 28

// stanzaExists reports whether node i's stanza is in the repository.
func (e *Env) stanzaExists(i int) bool {
	return fileExists(e.archiveInfo(i))
}

func (e *Env) archiveInfo(i int) string {
	return filepath.Join(e.BackupDir(), "repo", "archive", e.Stanza(i), "archive.info")
}

// stanzaCurrent reports whether node i's stanza is of the node's database
// as it is: its archive.info's current system identifier and version are
// those in the node's pg_control. Then stanza-create has nothing to do,
// and up skips it: it takes pgBackRest 0.8 s a server (each of its
// queries waits 100 ms), and testenv runs up after every exclusive test.
func (e *Env) stanzaCurrent(i int) bool {
	b, err := os.ReadFile(e.archiveInfo(i))
	if err != nil {
		return false
	}
	var id, version string
	section := ""
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, "["):
			section = l
		case section == "[db]" && strings.HasPrefix(l, "db-system-id="):
			id = strings.TrimPrefix(l, "db-system-id=")
		case section == "[db]" && strings.HasPrefix(l, "db-version="):
			version = strings.TrimPrefix(l, "db-version=")
		}
	}
	data := []string{e.pgData(i)}
	if e.IsGroup(i) {
		data = nil
		n, _, _ := e.recordedMembers(i)
		for m := 1; m <= n; m++ {
			data = append(data, filepath.Join(e.MemberDir(i, m), "data"))
		}
	}
	for _, d := range data {
		// pg_control begins with the system identifier, a uint64 in
		// the machine's byte order.
		f, err := os.Open(filepath.Join(d, "global", "pg_control"))
		if err != nil {
			continue
		}
		var buf [8]byte
		_, err = io.ReadFull(f, buf[:])
		f.Close()
		if err == nil {
			return version == `"15"` && id == strconv.FormatUint(binary.NativeEndian.Uint64(buf[:]), 10)
		}
	}
	return false
}
