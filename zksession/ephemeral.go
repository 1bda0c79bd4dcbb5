package zksession

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/internal/backoff"
)

// Ephemeral is an ephemeral node this process keeps alive across sessions:
// when a session expires the server deletes the node, and the Session
// re-creates it, with its latest data, as soon as it has a new one.
type Ephemeral struct {
	s    *Session
	path string
	acl  []zk.ACL

	// lock: the node of a Lock, never re-created (see ensure).
	lock bool

	mu      sync.Mutex
	data    []byte
	gen     uint64 // bumped by Set
	deleted bool
	// creating: the first create has not returned yet. A re-sync then
	// leaves the node to it (it lands on the current session or fails).
	creating bool
	// stopGuard ends the guard (nil for a lock's node).
	stopGuard context.CancelFunc
	// writing is held by a create and by Delete, one at a time: the guard
	// and the re-sync may both re-create the node after an expiry, and a
	// create already sent when Delete ran would bring the node back after
	// it (a member record left behind by a clean stop).
	writing chan struct{}
}

// ErrOwnedElsewhere means an ephemeral node exists but belongs to another
// session: another process registered the same identity, or our previous
// session has not been expired by the server yet.
var ErrOwnedElsewhere = errors.New("ephemeral node is owned by another session")

// CreateEphemeral creates an ephemeral node at p with acl (nil: the
// session's ACL) and keeps it alive across sessions until Delete. Its
// parent must exist (ErrNoNode otherwise): parents are the caller's, with
// ACLs of their own, so this never creates one. A node re-created on a new
// session whose parent was deleted meanwhile fails and is retried.
func (s *Session) CreateEphemeral(ctx context.Context, p string, data []byte, acl []zk.ACL) (*Ephemeral, error) {
	return s.createEphemeral(ctx, p, data, acl, false)
}

// createEphemeral is CreateEphemeral; a lock's node (lock) is kept across
// reconnects of the same session but never re-created on a new one.
func (s *Session) createEphemeral(ctx context.Context, p string, data []byte, acl []zk.ACL, lock bool) (*Ephemeral, error) {
	if err := checkSize("create", p, data); err != nil {
		return nil, err
	}
	if acl == nil {
		acl = s.cfg.ACL
	}
	e := &Ephemeral{s: s, path: p, acl: acl, data: data, lock: lock, creating: true, writing: make(chan struct{}, 1)}
	s.mu.Lock()
	if _, dup := s.ephemerals[p]; dup {
		s.mu.Unlock()
		return nil, &OpError{"create ephemeral", p, ErrAlreadyHeld}
	}
	s.ephemerals[p] = e
	s.mu.Unlock()
	err := e.create(ctx)
	e.mu.Lock()
	e.creating = false
	e.mu.Unlock()
	if err != nil {
		s.mu.Lock()
		delete(s.ephemerals, p)
		s.mu.Unlock()
		return nil, err
	}
	if !lock {
		e.guard()
	}
	return e, nil
}

// guard re-creates the node when it disappears while the session lives:
// somebody deleted it (an admin by hand, or an identity allowed to delete
// in its parent). A member record deleted that way was never re-created,
// and moves and GC then skipped a live host (issue 38). A lock's node is
// not guarded: its loss is reported to the holder instead.
//
// It reads and re-arms a watch after every event instead of following a
// Watch: a Watch delivers changes of state, and a node re-created and
// deleted again between two of its reads looks unchanged to it.
func (e *Ephemeral) guard() {
	ctx, cancel := context.WithCancel(context.Background())
	e.mu.Lock()
	e.stopGuard = cancel
	deleted := e.deleted
	e.mu.Unlock()
	if deleted {
		cancel()
		return
	}
	s := e.s
	resync := make(chan struct{}, 1)
	s.mu.Lock()
	s.resyncs[resync] = struct{}{}
	s.mu.Unlock()
	go func() {
		defer func() {
			s.mu.Lock()
			delete(s.resyncs, resync)
			s.mu.Unlock()
		}()
		b := backoff.New(50*time.Millisecond, time.Second)
		for {
			var ev <-chan zk.Event
			if s.State() == StateConnected {
				f, err := s.fetchW(ctx, e.path, false)
				switch {
				case ctx.Err() != nil || errors.Is(err, ErrClosed):
					return
				case err != nil:
					ev = nil // read again after a pause
				case !f.node.Exists:
					if _, _, deleted := e.latest(); deleted {
						return
					}
					s.log.Warn("ephemeral node deleted under this session; re-creating it", zap.String("path", e.path))
					e.ensure()
					continue
				default:
					b.Reset()
					ev = f.ev
				}
			}
			var pause <-chan time.Time
			if ev == nil && s.State() == StateConnected {
				pause = time.After(b.Next())
			}
			select {
			case <-ev:
			case <-pause:
			case <-resync: // back to Connected: the re-sync re-creates; read again
			case <-ctx.Done():
				return
			case <-s.closed:
				return
			}
		}
	}()
}

// Path is the node's path.
func (e *Ephemeral) Path() string { return e.path }

func (e *Ephemeral) create(ctx context.Context) error {
	if err := e.hold(ctx); err != nil {
		return err
	}
	defer e.release()
	for try := 0; ; try++ {
		data, gen, deleted := e.latest()
		if deleted {
			return nil
		}
		err := e.s.create(ctx, e.path, data, zk.FlagEphemeral, e.acl)
		if err == nil {
			if _, g, _ := e.latest(); g == gen {
				return nil
			}
			// A Set raced with the create (it found no node yet): the node
			// holds older data than the latest; bring it up to date below.
		} else if !errors.Is(err, ErrNodeExists) {
			return err
		}
		// It exists: ours (a create whose answer we missed, or a session
		// that survived a disconnect) or somebody else's.
		cur, st, gerr := e.s.Get(ctx, e.path)
		if errors.Is(gerr, ErrNoNode) && try < 3 {
			// Gone between the create and the read: its owner's session
			// just expired (a killed process's lock). Create again.
			continue
		}
		if gerr != nil {
			return gerr
		}
		sid := e.s.SessionID()
		if st.EphemeralOwner != sid {
			return &OpError{"create ephemeral", e.path, fmt.Errorf("%w (owner 0x%x, this session 0x%x)", ErrOwnedElsewhere, st.EphemeralOwner, sid)}
		}
		// The data to keep is read after the node's version: a Set that
		// landed before the Get has already stored its data here, so it
		// is never overwritten with what was current before it (the
		// member record that lost a fail-static episode, issue 24).
		data, _, _ = e.latest()
		if bytes.Equal(cur, data) {
			return nil
		}
		_, err = e.s.Set(ctx, e.path, data, st.Version)
		if errors.Is(err, ErrBadVersion) && try < 3 {
			continue // a Set landed meanwhile: compare again
		}
		return err
	}
}

// hold waits for the node's other create or Delete to end (release).
func (e *Ephemeral) hold(ctx context.Context) error {
	select {
	case e.writing <- struct{}{}:
		return nil
	case <-ctx.Done():
		return &OpError{"write ephemeral", e.path, ctx.Err()}
	}
}

func (e *Ephemeral) release() { <-e.writing }

// latest is the data to keep, its generation (bumped by every Set) and
// whether the node was deleted.
func (e *Ephemeral) latest() ([]byte, uint64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.data, e.gen, e.deleted
}

// ensure re-creates the node after a reconnect, retrying while the session
// stays connected (an old owner's session may take up to its timeout to be
// expired by the server).
//
// A lock's node is never re-created: it is kept while this session still
// owns it (a reconnect of the same session), and forgotten otherwise (the
// session that held the lock expired; the holder learns it from the state
// change or its watch). Re-creating it before the holder noticed would
// leave a lock held for nobody.
func (e *Ephemeral) ensure() {
	b := backoff.New(100*time.Millisecond, 2*time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), e.s.cfg.OpTimeout)
		var err error
		if e.lock {
			err = e.keepIfOwned(ctx)
		} else {
			err = e.create(ctx)
		}
		cancel()
		if err == nil {
			return
		}
		e.s.log.Warn("re-creating ephemeral node", zap.String("path", e.path), zap.Error(err))
		if e.s.State() != StateConnected {
			return // the next return to Connected tries again
		}
		select {
		case <-e.s.closed:
			return
		case <-time.After(b.Next()):
		}
	}
}

// keepIfOwned forgets a lock's node unless this session owns it.
func (e *Ephemeral) keepIfOwned(ctx context.Context) error {
	e.mu.Lock()
	creating := e.creating
	e.mu.Unlock()
	if creating {
		return nil
	}
	_, st, err := e.s.Get(ctx, e.path)
	switch {
	case errors.Is(err, ErrNoNode):
	case err != nil:
		return err
	case st.EphemeralOwner == e.s.SessionID():
		return nil
	}
	e.forget()
	return nil
}

// Set replaces the node's data. The new data is kept for re-creation even
// when the write fails (for example while the session is suspended).
//
// It writes only a node this session owns: ZooKeeper checks no owner on a
// write, and after this session expired another one may have created the
// node (a supervisor started under the same member name while this one
// was cut off): overwriting its record would make two live owners of one
// name. Such a node is ErrOwnedElsewhere, and a missing one ErrNoNode (the
// re-creation after a reconnect brings it back).
func (e *Ephemeral) Set(ctx context.Context, data []byte) error {
	if err := checkSize("set", e.path, data); err != nil {
		return err
	}
	e.mu.Lock()
	e.data = data
	e.gen++
	e.mu.Unlock()
	return e.ifOwned(ctx, "set ephemeral", func(st Stat) error {
		_, err := e.s.Set(ctx, e.path, data, st.Version)
		return err
	})
}

// away is the error of a write while the session is closed or not
// connected: a write fails at once then (call), and so must the read
// before one, which would wait for the caller's deadline instead.
func (e *Ephemeral) away(op string) error {
	select {
	case <-e.s.closed:
		return &OpError{op, e.path, ErrClosed}
	default:
	}
	if st := e.s.State(); st != StateConnected {
		return &OpError{op, e.path, fmt.Errorf("%w (state %s)", ErrNotConnected, st)}
	}
	return nil
}

// forgetEphemeral stops keeping the node at p, if this session keeps one
// there (Session.Delete).
func (s *Session) forgetEphemeral(p string) {
	s.mu.Lock()
	e := s.ephemerals[p]
	s.mu.Unlock()
	if e != nil {
		e.forget()
	}
}

// forget stops maintaining the node without deleting it.
func (e *Ephemeral) forget() {
	e.mu.Lock()
	e.deleted = true
	stop := e.stopGuard
	e.mu.Unlock()
	if stop != nil {
		stop()
	}
	e.s.mu.Lock()
	if e.s.ephemerals[e.path] == e {
		delete(e.s.ephemerals, e.path)
	}
	e.s.mu.Unlock()
}

// Delete removes the node, if this session owns it, and stops maintaining
// it. Another session's node at the path (this one's expired, and another
// created it) is left alone, as Set leaves it.
func (e *Ephemeral) Delete(ctx context.Context) error {
	e.forget()
	// A create in flight lands first; any later one sees deleted.
	if err := e.hold(ctx); err != nil {
		return err
	}
	defer e.release()
	err := e.ifOwned(ctx, "delete ephemeral", func(st Stat) error { return e.s.Delete(ctx, e.path, st.Version) })
	if errors.Is(err, ErrNoNode) || errors.Is(err, ErrOwnedElsewhere) {
		return nil // not there, or not ours: nothing of ours to delete
	}
	return err
}

// ifOwned runs op (a write at the node's version) when this session owns
// the node, and looks again when a write of ours landed in between
// (ErrBadVersion). A missing node is ErrNoNode, another session's
// ErrOwnedElsewhere: ZooKeeper itself checks no owner on a write.
func (e *Ephemeral) ifOwned(ctx context.Context, what string, op func(Stat) error) error {
	for try := 0; ; try++ {
		if err := e.away(what); err != nil {
			return err
		}
		ok, st, err := e.s.Exists(ctx, e.path)
		switch {
		case err != nil:
			return err
		case !ok:
			return &OpError{what, e.path, ErrNoNode}
		case st.EphemeralOwner != e.s.SessionID():
			return &OpError{what, e.path, fmt.Errorf("%w (owner 0x%x, this session 0x%x)", ErrOwnedElsewhere, st.EphemeralOwner, e.s.SessionID())}
		}
		err = op(st)
		if errors.Is(err, ErrBadVersion) && try < 3 {
			continue
		}
		return err
	}
}
