package memzk_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/zksession"
	"github.com/shardvisor/shardvisor/zksession/memzk"
)

// backends runs a contract on memzk and, unless -short, on the real
// ensemble too, so that memzk keeps ZooKeeper's semantics where the
// tests above it rely on them. open returns a new session rooted at the
// same fresh test path each time it is called.
func backends(t *testing.T, contract func(t *testing.T, open func() *zksession.Session)) {
	t.Run("memzk", func(t *testing.T) {
		srv := memzk.New()
		contract(t, func() *zksession.Session { return zktest.MemorySession(t, srv, zksession.Config{}) })
	})
	t.Run("zookeeper", func(t *testing.T) {
		z := testenv.StartZK(t)
		contract(t, func() *zksession.Session {
			return zktest.Session(t, zksession.Config{Connect: z.ConnectString + z.Root})
		})
	})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestContractCAS(t *testing.T) {
	backends(t, func(t *testing.T, open func() *zksession.Session) {
		ctx, s := ctxT(t), open()
		if err := s.Create(ctx, "/a", []byte("1")); err != nil {
			t.Fatal(err)
		}
		if err := s.Create(ctx, "/a", nil); !errors.Is(err, zksession.ErrNodeExists) {
			t.Fatalf("second create: %v, want ErrNodeExists", err)
		}
		if err := s.Create(ctx, "/no/parent", nil); !errors.Is(err, zksession.ErrNoNode) {
			t.Fatalf("create without parent: %v, want ErrNoNode", err)
		}
		d, st, err := s.Get(ctx, "/a")
		if err != nil || string(d) != "1" || st.Version != 0 {
			t.Fatalf("get: %q %+v %v", d, st, err)
		}
		st2, err := s.Set(ctx, "/a", []byte("2"), st.Version)
		if err != nil || st2.Version != 1 || st2.Mzxid <= st.Mzxid || st2.Czxid != st.Czxid {
			t.Fatalf("set: %+v %v", st2, err)
		}
		if _, err := s.Set(ctx, "/a", []byte("3"), st.Version); !errors.Is(err, zksession.ErrBadVersion) {
			t.Fatalf("stale set: %v, want ErrBadVersion", err)
		}
		if err := s.Create(ctx, "/a/k", nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, "/a", zksession.AnyVersion); !errors.Is(err, zksession.ErrNotEmpty) {
			t.Fatalf("delete with child: %v, want ErrNotEmpty", err)
		}
		if err := s.Delete(ctx, "/a/k", 7); !errors.Is(err, zksession.ErrBadVersion) {
			t.Fatalf("delete at a wrong version: %v", err)
		}
		for _, k := range []string{"c", "b"} {
			if err := s.Create(ctx, "/a/"+k, nil); err != nil {
				t.Fatal(err)
			}
		}
		kids, st3, err := s.Children(ctx, "/a")
		if err != nil || len(kids) != 3 || st3.NumChildren != 3 {
			t.Fatalf("children: %v %+v %v", kids, st3, err)
		}
		if ok, _, err := s.Exists(ctx, "/a/zz"); ok || err != nil {
			t.Fatalf("exists of nothing: %v %v", ok, err)
		}
	})
}

func TestContractMultiIsAtomic(t *testing.T) {
	backends(t, func(t *testing.T, open func() *zksession.Session) {
		ctx, s := ctxT(t), open()
		if err := s.Create(ctx, "/m", []byte("0")); err != nil {
			t.Fatal(err)
		}
		_, err := s.Multi(ctx, zksession.SetOp("/m", []byte("1"), 0), zksession.CreateOp("/n", nil, nil), zksession.CheckOp("/m", 0))
		if !errors.Is(err, zksession.ErrBadVersion) {
			t.Fatalf("multi whose check fails after a set: %v, want ErrBadVersion", err)
		}
		d, st, _ := s.Get(ctx, "/m")
		if string(d) != "0" || st.Version != 0 {
			t.Fatalf("a failed multi changed /m: %q v%d", d, st.Version)
		}
		if ok, _, _ := s.Exists(ctx, "/n"); ok {
			t.Fatal("a failed multi created /n")
		}
		sts, err := s.Multi(ctx, zksession.CheckOp("/m", 0), zksession.SetOp("/m", []byte("1"), 0), zksession.CreateOp("/n", nil, nil), zksession.DeleteOp("/n", 0))
		if err != nil || len(sts) != 4 || sts[1].Version != 1 {
			t.Fatalf("multi: %+v %v", sts, err)
		}
		if ok, _, _ := s.Exists(ctx, "/n"); ok {
			t.Fatal("/n created and deleted in one multi still exists")
		}
	})
}

func TestContractEphemeralsAndWatches(t *testing.T) {
	backends(t, func(t *testing.T, open func() *zksession.Session) {
		ctx, s, other := ctxT(t), open(), open()
		if err := s.Create(ctx, "/dir", nil); err != nil {
			t.Fatal(err)
		}
		data := other.Watch(ctx, "/dir/e")
		defer data.Stop()
		kids := other.WatchChildren(ctx, "/dir")
		defer kids.Stop()
		if n := testenv.Receive(t, data.C, 10*time.Second, "first read"); n.Exists {
			t.Fatal("/dir/e exists before it is created")
		}
		testenv.Receive(t, kids.C, 10*time.Second, "first children")

		e, err := s.CreateEphemeral(ctx, "/dir/e", []byte("x"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if n := testenv.Receive(t, data.C, 10*time.Second, "creation"); !n.Exists || string(n.Data) != "x" || n.Stat.EphemeralOwner != s.SessionID() {
			t.Fatalf("after create: %+v (session 0x%x)", n, s.SessionID())
		}
		if n := testenv.Receive(t, kids.C, 10*time.Second, "child added"); len(n.Children) != 1 {
			t.Fatalf("children: %v", n.Children)
		}
		if err := e.Set(ctx, []byte("y")); err != nil {
			t.Fatal(err)
		}
		if n := testenv.Receive(t, data.C, 10*time.Second, "change"); string(n.Data) != "y" {
			t.Fatalf("after set: %q", n.Data)
		}
		if err := other.Create(ctx, "/dir/e/child", nil); err == nil {
			t.Fatal("an ephemeral node took a child")
		}
		s.Close() // its ephemeral goes with the session
		if n := testenv.Receive(t, data.C, 10*time.Second, "deletion"); n.Exists {
			t.Fatalf("after close: %+v", n)
		}
		if n := testenv.Receive(t, kids.C, 10*time.Second, "child removed"); len(n.Children) != 0 {
			t.Fatalf("children after close: %v", n.Children)
		}
	})
}

// An ephemeral node somebody else deletes while its session lives comes
// back, with its latest data, on the same session; after its own Delete
// it stays gone. A member record deleted by another identity was never
// re-created, so moves and GC skipped a live host (issue 38).
func TestContractEphemeralDeletedByAnotherComesBack(t *testing.T) {
	backends(t, func(t *testing.T, open func() *zksession.Session) {
		ctx, s, other := ctxT(t), open(), open()
		if err := s.Create(ctx, "/reg", nil); err != nil {
			t.Fatal(err)
		}
		e, err := s.CreateEphemeral(ctx, "/reg/m", []byte("v1"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Set(ctx, []byte("v2")); err != nil {
			t.Fatal(err)
		}
		w := other.Watch(ctx, "/reg/m")
		defer w.Stop()
		testenv.Receive(t, w.C, 10*time.Second, "first read")
		for round := 1; round <= 2; round++ {
			if err := other.Delete(ctx, "/reg/m", zksession.AnyVersion); err != nil {
				t.Fatal(err)
			}
			n := testenv.Receive(t, w.C, 10*time.Second, "deletion")
			for !n.Exists {
				n = testenv.Receive(t, w.C, 10*time.Second, fmt.Sprintf("re-creation in round %d", round))
			}
			if string(n.Data) != "v2" || n.Stat.EphemeralOwner != s.SessionID() {
				t.Fatalf("round %d: re-created as %q owned by 0x%x, want v2 owned by 0x%x", round, n.Data, n.Stat.EphemeralOwner, s.SessionID())
			}
		}
		if err := e.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		if n := testenv.Receive(t, w.C, 10*time.Second, "own deletion"); n.Exists {
			t.Fatalf("after Delete: %+v", n)
		}
		// A guard still running would re-create it within a watch round
		// trip; a second session's read after the first's sync sees it.
		time.Sleep(500 * time.Millisecond)
		if ok, _, err := other.Exists(ctx, "/reg/m"); err != nil || ok {
			t.Fatalf("after Delete the node came back: %v %v", ok, err)
		}
		// Its own session deleting it, one node or the whole tree (a
		// cluster's or a test root's cleanup), means it should be gone:
		// DeleteAll failed with "node has children" when the guard put
		// the node back in between (CI run 12).
		if _, err := s.CreateEphemeral(ctx, "/reg/m", []byte("v3"), nil); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteAll(ctx, "/reg"); err != nil {
			t.Fatalf("DeleteAll of a tree holding this session's ephemeral: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
		if ok, _, err := other.Exists(ctx, "/reg"); err != nil || ok {
			t.Fatalf("after DeleteAll: %v %v", ok, err)
		}
	})
}

func TestContractLockIsExclusive(t *testing.T) {
	backends(t, func(t *testing.T, open func() *zksession.Session) {
		ctx, a, b := ctxT(t), open(), open()
		if err := a.Create(ctx, "/locks", nil); err != nil {
			t.Fatal(err)
		}
		la, err := a.TryLock(ctx, "/locks/x", []byte("a"), openACL)
		if err != nil {
			t.Fatal(err)
		}
		var le *zksession.LockedError
		if _, err := b.TryLock(ctx, "/locks/x", []byte("b"), openACL); !errors.As(err, &le) || string(le.Holder) != "a" {
			t.Fatalf("second lock: %v, want locked by a", err)
		}
		got := make(chan error, 1)
		go func() {
			lb, err := b.Lock(ctx, "/locks/x", []byte("b"), openACL, nil)
			if err == nil {
				err = lb.Release(ctx)
			}
			got <- err
		}()
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := testenv.Receive(t, got, 10*time.Second, "the waiter's lock"); err != nil {
			t.Fatal(err)
		}
	})
}

// What only memzk does: a session expiry on demand loses the lock and the
// ephemeral, and the session comes back with a new id that re-creates its
// registered ephemeral node.
func TestExpireLosesLockAndRecreatesEphemeral(t *testing.T) {
	srv := memzk.New()
	s := zktest.MemorySession(t, srv, zksession.Config{})
	watcher := zktest.MemorySession(t, srv, zksession.Config{})
	ctx := ctxT(t)
	if err := s.CreateAll(ctx, "/l"); err != nil {
		t.Fatal(err)
	}
	lock, err := s.TryLock(ctx, "/l/lock", []byte("me"), openACL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateEphemeral(ctx, "/l/member", []byte("m"), nil); err != nil {
		t.Fatal(err)
	}
	sub := s.Subscribe()
	defer sub.Close()
	old := s.SessionID()
	c, err := srv.ConnOf(old)
	if err != nil {
		t.Fatal(err)
	}
	c.Expire()
	select {
	case <-lock.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lock was not reported lost after the session expired")
	}
	for {
		ch := testenv.Receive(t, sub.C, 10*time.Second, "state change")
		if ch.To == zksession.StateConnected {
			if !ch.NewSession || ch.SessionID == old {
				t.Fatalf("reconnected without a new session: %+v", ch)
			}
			break
		}
	}
	testenv.WaitFor(t, 10*time.Second, func() bool {
		_, st, err := watcher.Get(ctx, "/l/member")
		return err == nil && st.EphemeralOwner == s.SessionID()
	}, "the member node re-created on the new session")
	if ok, _, _ := watcher.Exists(ctx, "/l/lock"); ok {
		t.Fatal("the lock node outlived its session")
	}
}

// Disconnect suspends the session (calls wait, writes are refused) and
// Reconnect brings it back on the same session.
func TestDisconnectSuspendsAndReconnectResumes(t *testing.T) {
	srv := memzk.New()
	s := zktest.MemorySession(t, srv, zksession.Config{SessionTimeout: 3 * time.Second, OpTimeout: 200 * time.Millisecond})
	ctx := ctxT(t)
	id := s.SessionID()
	c, _ := srv.ConnOf(id)
	c.Disconnect()
	testenv.WaitFor(t, 10*time.Second, func() bool { return s.State() == zksession.StateSuspended }, "suspended")
	if err := s.Create(ctx, "/x", nil); !errors.Is(err, zksession.ErrNotConnected) {
		t.Fatalf("write while suspended: %v, want ErrNotConnected", err)
	}
	// No deadline of the caller's: OpTimeout bounds the call.
	if _, _, err := s.Get(context.Background(), "/"); !errors.Is(err, zksession.ErrTimeout) {
		t.Fatalf("read while cut off: %v, want a timeout", err)
	}
	c.Reconnect()
	testenv.WaitFor(t, 10*time.Second, func() bool { return s.State() == zksession.StateConnected }, "connected again")
	if s.SessionID() != id {
		t.Fatalf("session changed across a short disconnect: 0x%x -> 0x%x", id, s.SessionID())
	}
}

func TestSequentialNames(t *testing.T) {
	srv := memzk.New()
	c := srv.Connect(nil)
	defer c.Close()
	acl := zk.WorldACL(zk.PermAll)
	if _, err := c.Create("/q", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	a, _ := c.Create("/q/n-", nil, zk.FlagSequence, acl)
	b, _ := c.Create("/q/n-", nil, zk.FlagSequence|zk.FlagEphemeral, acl)
	if a != "/q/n-0000000000" || b != "/q/n-0000000001" {
		t.Fatalf("sequential names %q %q", a, b)
	}
}

var openACL = zk.WorldACL(zk.PermAll)

// slowConnectLog delays the session's "to connected" log line, which the
// monitor writes between publishing Connected and re-syncing the session's
// ephemeral nodes: a lock taken in that gap must stay registered.
type slowConnectLog struct{}

func (slowConnectLog) Write(p []byte) (int, error) {
	if strings.Contains(string(p), `"to":"connected"`) {
		time.Sleep(100 * time.Millisecond)
	}
	return len(p), nil
}
func (slowConnectLog) Sync() error { return nil }

// A lock taken right after the session connects, before the re-sync of its
// ephemerals, stays held: the same process asking again is refused.
func TestLockTakenBeforeResyncStaysHeld(t *testing.T) {
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(slowConnectLog{}), zap.InfoLevel)
	srv := memzk.New()
	s := zktest.MemorySession(t, srv, zksession.Config{Logger: zap.New(core)})
	ctx := ctxT(t)
	if err := s.Create(ctx, "/l", nil); err != nil {
		t.Fatal(err)
	}
	l1, err := s.TryLock(ctx, "/l/gc", []byte("a"), openACL)
	if err != nil {
		t.Fatal(err)
	}
	defer l1.Release(ctx)
	// deliberate: the re-sync runs once the delayed log line is written.
	time.Sleep(300 * time.Millisecond)
	if _, err := s.TryLock(ctx, "/l/gc", []byte("b"), openACL); !errors.Is(err, zksession.ErrAlreadyHeld) {
		t.Fatalf("second lock by the same process after the re-sync: %v, want ErrAlreadyHeld", err)
	}
	select {
	case <-l1.Done():
		t.Fatal("the first lock was reported lost")
	default:
	}
}
