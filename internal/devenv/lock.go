package devenv

import (
	"os"
	"path/filepath"
	"syscall"
)

// lock serialises the operations that change the environment (up, down,
// starting, stopping and breaking servers) across goroutines and
// processes: an exclusive flock on STATE/devenv.lock, the file
// scripts/devenv has always locked. Each call opens the file anew, so two
// goroutines of one process exclude each other too (flock locks an open
// file description). Go opens files close-on-exec: the servers started
// under the lock do not inherit it.
func (e *Env) lock() (unlock func(), err error) {
	if err := os.MkdirAll(e.c.Dir, 0o755); err != nil {
		return nil, err
	}
	_ = os.Chmod(e.c.Dir, 0o755)
	path := filepath.Join(e.c.Dir, "devenv.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		e.logf("waiting for another devenv command (lock %s)", path)
		for {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
			if err != syscall.EINTR {
				break
			}
		}
		if err != nil {
			f.Close()
			return nil, err
		}
	}
	return func() { f.Close() }, nil
}

// locked runs f under the environment's lock.
func (e *Env) locked(f func() error) error {
	unlock, err := e.lock()
	if err != nil {
		return err
	}
	defer unlock()
	return f()
}
