package devenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ensureInstalled checks that the servers' Debian packages are there
// (ZooKeeper, PostgreSQL, PgBouncer, pgBackRest; Patroni's when a group is
// asked for). Installing them is scripts/install-deps --servers's job,
// which scripts/devenv runs first.
func ensureInstalled(patroni bool) error {
	const hint = "; as root run: scripts/install-deps --servers"
	for _, j := range zkJars {
		if !fileExists(j) {
			return fmt.Errorf("ZooKeeper 3.8 is not installed (%s missing)%s", j, hint)
		}
	}
	if _, err := os.Stat(javaBin()); err != nil {
		return fmt.Errorf("java is not installed (Debian's zookeeper package depends on it)%s", hint)
	}
	for _, b := range []string{"postgres", "initdb", "pg_ctl"} {
		if !fileExists(filepath.Join(pgBin, b)) {
			return fmt.Errorf("PostgreSQL 15 server is not installed (%s missing)%s", filepath.Join(pgBin, b), hint)
		}
	}
	if !fileExists(pgbouncerBin) {
		return fmt.Errorf("PgBouncer is not installed (%s missing)%s", pgbouncerBin, hint)
	}
	if !fileExists(pgbackrestBin) {
		return fmt.Errorf("pgBackRest is not installed (%s missing: every server's archive_command runs it)%s", pgbackrestBin, hint)
	}
	if _, err := postgresCredential(); err != nil {
		return err
	}
	if !patroni {
		return nil
	}
	// Debian's patroni and python3-kazoo live in the system python.
	if !fileExists(patroniBin) || !fileExists("/usr/lib/python3/dist-packages/kazoo") {
		return fmt.Errorf("Patroni is not installed (%s, python3-kazoo)%s", patroniBin, hint)
	}
	if _, err := exec.LookPath("socat"); err != nil {
		return fmt.Errorf("socat is not installed%s", hint)
	}
	return nil
}
