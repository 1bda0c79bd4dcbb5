package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Locking protocol.
//
// Across processes: every test process that has at least one ordinary
// testenv user running holds LOCK_SH on <state>/testenv.lock through a single
// file descriptor; a disruptive test holds LOCK_EX on it. To keep a stream of
// overlapping shared holders from starving a waiting exclusive one, taking
// the shared lock from zero first passes a turnstile (LOCK_EX on
// <state>/testenv.turnstile, released at once), which an exclusive waiter
// holds while it waits.
//
// Within a process: ordinary tests hold procRW.RLock, a disruptive test holds
// procRW.Lock (so it waits for the process's other users, and new ones wait
// for it), and sharedCount counts the holders of the process's LOCK_SH.
//
// Per test: testState records what a test (by name) holds; a subtest is
// covered by its parent's hold and takes none of its own.

var (
	procRW      sync.RWMutex
	flockMu     sync.Mutex
	sharedCount int
	useFile     *os.File
	turnFile    *os.File

	statesMu sync.Mutex
	states   = map[string]*testState{}
)

type testState struct {
	t    testing.TB
	name string

	// guarded by statesMu
	shared    bool // holds procRW.RLock and a sharedCount reference
	exclusive bool // holds procRW.Lock and LOCK_EX
	covered   bool // a parent test holds a lock on its behalf
	coveredX  bool // ... and that lock is exclusive

	cleanupMu sync.Mutex
	cleanups  []func() // resource cleanups, run in reverse order
}

// stateFor returns the test's state, registering its final cleanup on first use.
func stateFor(t testing.TB) *testState {
	statesMu.Lock()
	defer statesMu.Unlock()
	if st, ok := states[t.Name()]; ok && st.t == t {
		return st
	}
	st := &testState{t: t, name: t.Name()}
	states[st.name] = st
	t.Cleanup(st.finish)
	return st
}

// ancestor returns the state of the closest enclosing test that holds a lock.
// statesMu must be held.
func (st *testState) ancestor() *testState {
	var best *testState
	for name, o := range states {
		if o == st || !strings.HasPrefix(st.name, name+"/") {
			continue
		}
		if !(o.shared || o.exclusive || o.covered) {
			continue
		}
		if best == nil || len(name) > len(best.name) {
			best = o
		}
	}
	return best
}

// addCleanup registers a resource cleanup to run when the test ends, after
// the environment has been restored (for exclusive tests) and before the
// test's locks are released.
func (st *testState) addCleanup(f func()) {
	st.cleanupMu.Lock()
	st.cleanups = append(st.cleanups, f)
	st.cleanupMu.Unlock()
}

// isExclusive reports whether the test (or a parent) holds the exclusive lock.
func (st *testState) isExclusive() bool {
	statesMu.Lock()
	defer statesMu.Unlock()
	return st.exclusive || st.coveredX
}

// finish runs at the end of the test: restore the environment if the test was
// exclusive, run resource cleanups, release locks.
func (st *testState) finish() {
	statesMu.Lock()
	exclusive, shared := st.exclusive, st.shared
	statesMu.Unlock()

	if exclusive && len(externalZK()) == 0 {
		if err := restoreAll(); err != nil {
			st.t.Errorf("testenv: restoring the environment after an exclusive test failed: %v", err)
		}
	}
	st.cleanupMu.Lock()
	cleanups := st.cleanups
	st.cleanups = nil
	st.cleanupMu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}

	statesMu.Lock()
	delete(states, st.name)
	st.shared, st.exclusive, st.covered, st.coveredX = false, false, false, false
	statesMu.Unlock()
	switch {
	case exclusive:
		releaseExclusive()
	case shared:
		releaseShared()
	}
}

// acquireShared takes the shared use lock for the test unless it (or a
// parent) already holds a lock.
func acquireShared(st *testState) error {
	statesMu.Lock()
	if st.shared || st.exclusive || st.covered {
		statesMu.Unlock()
		return nil
	}
	if a := st.ancestor(); a != nil {
		st.covered = true
		st.coveredX = a.exclusive || a.coveredX
		statesMu.Unlock()
		return nil
	}
	statesMu.Unlock()

	procRW.RLock()
	flockMu.Lock()
	if sharedCount == 0 {
		if err := openLockFiles(); err != nil {
			flockMu.Unlock()
			procRW.RUnlock()
			return err
		}
		err := flock(turnFile, syscall.LOCK_EX)
		if err == nil {
			err = flock(useFile, syscall.LOCK_SH)
			if uerr := flock(turnFile, syscall.LOCK_UN); err == nil {
				err = uerr
			}
		}
		if err != nil {
			flockMu.Unlock()
			procRW.RUnlock()
			return err
		}
	}
	sharedCount++
	flockMu.Unlock()

	statesMu.Lock()
	st.shared = true
	statesMu.Unlock()
	return nil
}

// Share makes a program that is not a test (a load benchmark) an ordinary
// user of the test servers under StateDir, as every integration test is:
// it waits while a disruptive test holds them, then holds them shared (a
// disruptive test waits for it) until release is called.
func Share() (release func(), err error) {
	if err := acquireShared(&testState{}); err != nil {
		return nil, err
	}
	return releaseShared, nil
}

func releaseShared() {
	flockMu.Lock()
	sharedCount--
	if sharedCount == 0 {
		_ = flock(useFile, syscall.LOCK_UN)
	}
	flockMu.Unlock()
	procRW.RUnlock()
}

// Exclusive makes the test the only user of the test servers, in this and in
// every other test process, until it ends; it is required before ZK.Kill,
// ZK.Start, PGNode.Stop and PGNode.Start. When the test ends, every server
// that is down is restarted and the environment is healthy again before
// other tests continue. Calling it again in the same test is a no-op; a
// subtest of an exclusive test is exclusive too.
func Exclusive(t testing.TB) {
	t.Helper()
	skipIfShort(t)
	st := stateFor(t)

	statesMu.Lock()
	if st.exclusive || st.coveredX {
		statesMu.Unlock()
		return
	}
	if a := st.ancestor(); a != nil {
		if a.exclusive || a.coveredX {
			st.covered, st.coveredX = true, true
			statesMu.Unlock()
			return
		}
		statesMu.Unlock()
		t.Fatalf("testenv: Exclusive called in %s, but its parent test %s already uses the servers (shared); call Exclusive in the parent", st.name, a.name)
		return
	}
	hadShared := st.shared
	st.covered = false
	statesMu.Unlock()

	if hadShared {
		// This test's own shared hold would make it wait for itself: give it
		// up; from here on the test is exclusive until it ends.
		statesMu.Lock()
		st.shared = false
		statesMu.Unlock()
		releaseShared()
	}

	procRW.Lock()
	flockMu.Lock()
	err := openLockFiles()
	if err == nil {
		err = flock(turnFile, syscall.LOCK_EX)
		if err == nil {
			if syscall.Flock(int(useFile.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
				t.Logf("testenv: waiting for other test processes to release the servers (lock %s)", useFile.Name())
				err = flock(useFile, syscall.LOCK_EX)
			}
			if uerr := flock(turnFile, syscall.LOCK_UN); err == nil {
				err = uerr
			}
		}
	}
	flockMu.Unlock()
	if err != nil {
		procRW.Unlock()
		fatalf(t, "exclusive lock: %v", err)
		return
	}
	statesMu.Lock()
	st.exclusive = true
	statesMu.Unlock()

	if len(externalZK()) == 0 {
		if err := ensureUp(pgNodesWanted()); err != nil {
			fatalf(t, "starting servers: %v", err)
		}
	}
}

func releaseExclusive() {
	flockMu.Lock()
	_ = flock(useFile, syscall.LOCK_UN)
	flockMu.Unlock()
	procRW.Unlock()
}

// openLockFiles opens the process-wide lock files once. flockMu must be held.
func openLockFiles() error {
	if useFile != nil {
		return nil
	}
	dir := StateDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	u, err := os.OpenFile(filepath.Join(dir, "testenv.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return err
	}
	tf, err := os.OpenFile(filepath.Join(dir, "testenv.turnstile"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		u.Close()
		return err
	}
	useFile, turnFile = u, tf
	return nil
}

// flock applies how to f, retrying on EINTR.
func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			if err != nil {
				return fmt.Errorf("flock %s: %w", f.Name(), err)
			}
			return nil
		}
	}
}

// lockFile takes LOCK_EX on path (created if needed) and returns the unlock.
func lockFile(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	if err := flock(f, syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = flock(f, syscall.LOCK_UN)
		f.Close()
	}, nil
}
