package zksession

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-zookeeper/zk"
)

// Lock errors, for errors.Is.
var (
	// ErrLocked: another session holds the lock. The error is a
	// *LockedError naming the holder.
	ErrLocked = errors.New("lock is held by another session")
	// ErrAlreadyHeld: this process already holds (or keeps) an ephemeral
	// node, so a lock, at that path.
	ErrAlreadyHeld = errors.New("already registered by this process")
	// ErrLockLost is the cause of a Lock.Context cancelled because the
	// lock was lost.
	ErrLockLost = errors.New("lock lost")
)

// LockedError is TryLock's refusal: Holder is the lock node's content as
// its holder wrote it (nil if it vanished before it could be read), for
// the caller to describe.
type LockedError struct {
	Path   string
	Holder []byte
}

func (e *LockedError) Error() string {
	if e.Holder == nil {
		return fmt.Sprintf("zookeeper lock %s: %v", e.Path, ErrLocked)
	}
	return fmt.Sprintf("zookeeper lock %s: %v (%s)", e.Path, ErrLocked, e.Holder)
}

func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// Lock is an exclusive lock tied to this Session: an ephemeral node whose
// content names the holder. It is lost, and Done is closed, when the
// session is lost or closed (the server may then give the node to another
// process) or when the node vanishes or changes owner. A lost lock is
// never taken back silently: the holder must stop and TryLock again.
type Lock struct {
	s    *Session
	e    *Ephemeral
	sub  *Subscription
	w    *Watch
	done chan struct{}
	once sync.Once
	rel  sync.Once
	quit chan struct{} // Release: stop the watcher
	exit chan struct{} // the watcher has returned
}

// TryLock takes the lock at p, an ephemeral node created with acl (the
// caller's: the lock's place decides who may see and break it), or fails
// at once: with an error wrapping ErrLocked (a *LockedError naming the
// holder) when another session holds it, ErrAlreadyHeld when this process
// does. p's parent must exist.
func (s *Session) TryLock(ctx context.Context, p string, holder []byte, acl []zk.ACL) (*Lock, error) {
	if len(acl) == 0 {
		return nil, &OpError{"lock", p, errors.New("no ACL given for the lock node")}
	}
	sub := s.Subscribe()
	e, err := s.createEphemeral(ctx, p, holder, acl, true)
	if err != nil {
		sub.Close()
		if errors.Is(err, ErrOwnedElsewhere) {
			le := &LockedError{Path: p}
			if b, _, gerr := s.Get(ctx, p); gerr == nil {
				le.Holder = b
			}
			return nil, le
		}
		return nil, err
	}
	l := &Lock{s: s, e: e, sub: sub, done: make(chan struct{}), quit: make(chan struct{}), exit: make(chan struct{})}
	// The watch starts after the create, so its first read sees our node.
	wctx, cancel := context.WithCancel(context.Background())
	l.w = s.Watch(wctx, p)
	go func() {
		defer close(l.exit)
		defer cancel()
		l.follow()
	}()
	return l, nil
}

// follow closes done on the first sign of loss.
func (l *Lock) follow() {
	for {
		select {
		case <-l.quit:
			return
		case ch, ok := <-l.sub.C:
			if !ok || ch.To == StateLost || ch.To == StateClosed {
				l.lose()
				return
			}
		case n := <-l.w.C:
			if !n.Exists || n.Stat.EphemeralOwner != l.s.SessionID() {
				l.lose()
				return
			}
		}
	}
}

// lose closes done and stops keeping the node alive: a new session must
// not re-create a lock its holder has been told it lost.
func (l *Lock) lose() {
	l.once.Do(func() {
		l.e.forget()
		close(l.done)
	})
}

// Done is closed when the lock is lost (or released).
func (l *Lock) Done() <-chan struct{} { return l.done }

// Path is the lock node's path.
func (l *Lock) Path() string { return l.e.Path() }

// Context returns a context derived from parent that is cancelled, with
// cause ErrLockLost, when the lock is lost: work done under the lock
// stops with it.
func (l *Lock) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	go func() {
		select {
		case <-l.done:
			cancel(fmt.Errorf("%w: %s", ErrLockLost, l.Path()))
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// Release gives the lock up: it deletes the node if this session still
// owns it (never another holder's) and closes Done.
func (l *Lock) Release(ctx context.Context) error {
	lost := false
	select {
	case <-l.done:
		lost = true
	default:
	}
	l.lose()
	l.rel.Do(func() {
		close(l.quit)
		<-l.exit
		l.w.Stop()
		l.sub.Close()
	})
	if lost && l.s.State() == StateClosed {
		return nil
	}
	_, st, err := l.s.Get(ctx, l.e.path)
	if errors.Is(err, ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.EphemeralOwner != l.s.SessionID() {
		return nil // somebody else's now
	}
	err = l.s.Delete(ctx, l.e.path, st.Version)
	if errors.Is(err, ErrNoNode) || errors.Is(err, ErrBadVersion) {
		return nil
	}
	return err
}

// Lock waits for the lock at p (TryLock, with acl): it calls onWait (if
// not nil) with each refusal, waits for the holder's node to go away, and
// tries again, until it holds the lock or ctx ends.
func (s *Session) Lock(ctx context.Context, p string, holder []byte, acl []zk.ACL, onWait func(*LockedError)) (*Lock, error) {
	for {
		l, err := s.TryLock(ctx, p, holder, acl)
		var le *LockedError
		if !errors.As(err, &le) {
			return l, err
		}
		if onWait != nil {
			onWait(le)
		}
		if err := s.waitGone(ctx, p); err != nil {
			return nil, err
		}
	}
}

// waitGone returns when p does not exist (a Watch never closes its
// channel, so ctx is watched too).
func (s *Session) waitGone(ctx context.Context, p string) error {
	w := s.Watch(ctx, p)
	defer w.Stop()
	for {
		select {
		case n := <-w.C:
			if !n.Exists {
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closed:
			return ErrClosed
		}
	}
}
