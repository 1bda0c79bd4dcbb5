package zksession_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/faultproxy"
	"github.com/shardvisor/shardvisor/internal/testenv"
	. "github.com/shardvisor/shardvisor/zksession"
)

func closedWithin(t *testing.T, c <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(d):
		t.Fatalf("%s: not closed within %s", what, d)
	}
}

func stillOpen(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
		t.Fatalf("%s: closed", what)
	default:
	}
}

// releaseLost releases old, a lock that was lost, and checks that this
// touched neither the lock node at path, now s's, nor held, the new
// holder's lock on it.
func releaseLost(t *testing.T, ctx context.Context, old *Lock, s *Session, path string, held *Lock, what string) {
	t.Helper()
	if err := old.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_, st, err := s.Get(ctx, path)
	if err != nil || st.EphemeralOwner != s.SessionID() {
		t.Fatalf("%s: owner %x, %v", what, st.EphemeralOwner, err)
	}
	stillOpen(t, held.Done(), "the new holder's lock")
}

// mustLock takes the lock at path on s for holder; it must be free.
func mustLock(t *testing.T, ctx context.Context, s *Session, path, holder string) *Lock {
	t.Helper()
	l, err := s.TryLock(ctx, path, []byte(holder), s.ACL())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A second acquirer is refused with the holder named; the holder's session
// closing closes Done and cancels Context; then the other gets the lock.
func TestIntegrationLockRefusedThenLostOnClose(t *testing.T) {
	ctx, a, b := twoSessions(t)

	if _, err := a.TryLock(ctx, "/locks/x/holder", []byte("x"), a.ACL()); !errors.Is(err, ErrNoNode) {
		t.Fatalf("lock without its parent: %v, want ErrNoNode (parents are the caller's)", err)
	}
	if _, err := a.TryLock(ctx, "/locks/x/holder", []byte("x"), nil); err == nil {
		t.Fatal("a lock without an ACL was taken")
	}
	if err := a.CreateAll(ctx, "/locks/x"); err != nil {
		t.Fatal(err)
	}
	la := mustLock(t, ctx, a, "/locks/x/holder", "host-a pid 1")
	if _, err := a.TryLock(ctx, "/locks/x/holder", []byte("again"), a.ACL()); !errors.Is(err, ErrAlreadyHeld) {
		t.Fatalf("same process twice: %v, want ErrAlreadyHeld", err)
	}
	_, err := b.TryLock(ctx, "/locks/x/holder", []byte("host-b"), b.ACL())
	var le *LockedError
	if !errors.Is(err, ErrLocked) || !errors.As(err, &le) || string(le.Holder) != "host-a pid 1" ||
		!strings.Contains(err.Error(), "host-a pid 1") {
		t.Fatalf("second acquirer: %v (holder %+v), want ErrLocked naming host-a", err, le)
	}
	workCtx, cancel := la.Context(ctx)
	defer cancel()
	stillOpen(t, la.Done(), "Done while held")

	a.Close()
	closedWithin(t, la.Done(), 10*time.Second, "Done after the holder's session closed")
	closedWithin(t, workCtx.Done(), 5*time.Second, "Context after loss")
	if !errors.Is(context.Cause(workCtx), ErrLockLost) {
		t.Fatalf("context cause %v, want ErrLockLost", context.Cause(workCtx))
	}
	if err := la.Release(ctx); err != nil {
		t.Fatalf("releasing a lost lock: %v", err)
	}
	lb, err := b.TryLock(ctx, "/locks/x/holder", []byte("host-b"), b.ACL())
	if err != nil {
		t.Fatalf("after the holder closed: %v", err)
	}
	defer lb.Release(ctx)
}

// Release lets the next one in, and a waiter blocked in Lock gets it.
func TestIntegrationLockReleaseAndWait(t *testing.T) {
	ctx, a, b := twoSessions(t)

	la := mustLock(t, ctx, a, "/l", "a")
	got := make(chan *Lock, 1)
	waited := make(chan []byte, 1)
	go func() {
		l, err := b.Lock(ctx, "/l", []byte("b"), b.ACL(), func(le *LockedError) {
			select {
			case waited <- le.Holder:
			default:
			}
		})
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	if h := testenv.Receive(t, waited, 10*time.Second, "waiter never reported the holder"); string(h) != "a" {
		t.Fatalf("waiter told holder %q, want a", h)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	closedWithin(t, la.Done(), time.Second, "Done after Release")
	lb := testenv.Receive(t, got, 10*time.Second, "waiter did not get the lock after release")
	if lb == nil {
		t.Fatal("waiter failed")
	}
	stillOpen(t, lb.Done(), "new holder's Done")
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A waiter gives up with its context.
	mustLock(t, ctx, a, "/l", "a")
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := b.Lock(short, "/l", nil, b.ACL(), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting past the deadline: %v", err)
	}
}

// The node vanishing (deleted by an operator) loses the lock, and Release
// then does not delete anybody else's node.
func TestIntegrationLockLostWhenNodeVanishes(t *testing.T) {
	ctx, a, b := twoSessions(t)
	la := mustLock(t, ctx, a, "/l", "a")
	if err := b.Delete(ctx, "/l", AnyVersion); err != nil {
		t.Fatal(err)
	}
	closedWithin(t, la.Done(), 10*time.Second, "Done after the node was deleted")
	lb := mustLock(t, ctx, b, "/l", "b")
	releaseLost(t, ctx, la, b, "/l", lb, "the old holder's Release touched the new holder's node")
	_ = lb.Release(ctx)
}

// The holder's session expiring behind a partition closes Done (at the
// session's Lost, before the server expires it), and the node is not
// re-created for the holder when its new session comes.
func TestIntegrationLockLostOnExpiry(t *testing.T) {
	skipUnderRace(t)
	ctx, proxy, observer, viaProxy := partitionable(t)
	s := openT(t, Config{Connect: viaProxy, SessionTimeout: 4 * time.Second, OpTimeout: 2 * time.Second})
	l := mustLock(t, ctx, s, "/l", "me")
	c := collect(s)
	proxy.SetMode(faultproxy.Blackhole)
	closedWithin(t, l.Done(), 20*time.Second, "Done behind a partition")
	lost := c.waitFor(t, time.Second, func(ch StateChange) bool { return ch.To == StateLost }, "to lost")
	_ = lost
	// The server expires the session; another process takes the lock.
	var lo *Lock
	var err error
	deadline := time.Now().Add(20 * time.Second)
	for {
		lo, err = observer.TryLock(ctx, "/l", []byte("observer"), observer.ACL())
		if err == nil {
			break
		}
		if !errors.Is(err, ErrLocked) || time.Now().After(deadline) {
			t.Fatalf("observer after expiry: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	defer lo.Release(ctx)
	proxy.SetMode(faultproxy.Pass)
	c.waitFor(t, 30*time.Second, func(ch StateChange) bool { return ch.To == StateConnected && ch.NewSession }, "new session")
	time.Sleep(time.Second) // give a (wrong) re-creation time to happen
	releaseLost(t, ctx, l, observer, "/l", lo, "lock node after the old holder came back")
}
