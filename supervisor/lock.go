package supervisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrAlreadyRunning is the error New returns when another supervisor of the
// same pool runs on this host (it holds the state directory's lock).
var ErrAlreadyRunning = errors.New("another supervisor runs this pool on this host")

// LockFileName is the lock file in the state directory. One supervisor per
// pool per host: two would fight over the sockets (the second's binds fail
// and it retried them forever, publishing a failed swap to the pool's
// shared status record each time) and over the state directory's files.
const LockFileName = "supervisor.lock"

func lockPath(stateDir string) string { return filepath.Join(stateDir, LockFileName) }

// lockStateDir takes the pool's lock: an exclusive flock on
// <state dir>/supervisor.lock, holding this process's pid. inherited is the
// lock fd an upgrade's old supervisor handed over (nil: none); a flock
// belongs to the open file description, so an inherited fd already holds
// it, and the old supervisor only closes its copy, never unlocks it.
func lockStateDir(pool, stateDir string, inherited *os.File) (f *os.File, took bool, err error) {
	path := lockPath(stateDir)
	if inherited != nil {
		if sameFile(inherited, path) && unix.Flock(int(inherited.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			return inherited, true, nil
		}
		// A different state directory than the old supervisor's: lock
		// this one as a fresh start would.
		_ = inherited.Close()
	}
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false, fmt.Errorf("supervisor: lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, fmt.Errorf("%w: pool %q is already supervised here by %s, which holds the lock on %s (stop it first; to replace its binary without downtime send it SIGUSR2)",
				ErrAlreadyRunning, pool, lockHolder(path), path)
		}
		return nil, false, fmt.Errorf("supervisor: locking %s: %w", path, err)
	}
	if err := writeLockPid(f); err != nil {
		f.Close()
		return nil, false, fmt.Errorf("supervisor: lock file %s: %w", path, err)
	}
	return f, false, nil
}

// writeLockPid records this process as the holder, for the refusal message
// of the next one.
func writeLockPid(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return err
}

func lockHolder(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "another process"
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return "another process (its pid is not recorded yet)"
	}
	return "pid " + strconv.Itoa(pid)
}

func sameFile(f *os.File, path string) bool {
	var a, b syscall.Stat_t
	if syscall.Fstat(int(f.Fd()), &a) != nil || syscall.Stat(path, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}
