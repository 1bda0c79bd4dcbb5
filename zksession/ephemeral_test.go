package zksession

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

// nodeConn is a Conn holding one znode, owned by session 1. hook runs once,
// at the next create, before the create lands.
type nodeConn struct {
	Conn    // the calls not made here: nil, they panic
	mu      sync.Mutex
	data    []byte
	version int32
	exists  bool
	hook    func()
	writes  []string // data of every create and set that succeeded, in order
	other   bool     // the node is another session's (session 2)
	// watched is closed at the guard's first read: from then on it waits
	// on a watch that never fires, and the test alone changes the node.
	watched   chan struct{}
	watchOnce sync.Once
}

func (c *nodeConn) owner() int64 {
	if c.other {
		return 2
	}
	return 1
}

func (c *nodeConn) Exists(p string) (bool, *zk.Stat, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.exists {
		return false, nil, nil
	}
	return true, &zk.Stat{Version: c.version, EphemeralOwner: c.owner()}, nil
}

func (c *nodeConn) SessionID() int64 { return 1 }

func (c *nodeConn) Create(p string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	c.mu.Lock()
	hook := c.hook
	c.hook = nil
	c.mu.Unlock()
	if hook != nil {
		hook() // an update in the instant before the create lands
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exists {
		return "", zk.ErrNodeExists
	}
	c.data, c.version, c.exists = data, 0, true
	c.writes = append(c.writes, string(data))
	return p, nil
}

func (c *nodeConn) Get(p string) ([]byte, *zk.Stat, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.exists {
		return nil, nil, zk.ErrNoNode
	}
	return c.data, &zk.Stat{Version: c.version, EphemeralOwner: c.owner()}, nil
}

// GetW and ExistsW serve the node's guard (Ephemeral.guard), which reads
// once after the create and then waits: these tests change the node behind
// the session's back and drive the re-creation themselves, so the watches
// never fire.
func (c *nodeConn) GetW(p string) ([]byte, *zk.Stat, <-chan zk.Event, error) {
	d, st, err := c.Get(p)
	c.watchOnce.Do(func() { close(c.watched) })
	return d, st, make(chan zk.Event), err
}

func (c *nodeConn) ExistsW(p string) (bool, *zk.Stat, <-chan zk.Event, error) {
	ok, st, err := c.Exists(p)
	c.watchOnce.Do(func() { close(c.watched) })
	return ok, st, make(chan zk.Event), err
}

func (c *nodeConn) Set(p string, data []byte, version int32) (*zk.Stat, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.exists {
		return nil, zk.ErrNoNode
	}
	if version != AnyVersion && version != c.version {
		return nil, zk.ErrBadVersion
	}
	c.data = data
	c.version++
	c.writes = append(c.writes, string(data))
	return &zk.Stat{Version: c.version, EphemeralOwner: 1}, nil
}

func (c *nodeConn) Delete(p string, version int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.exists {
		return zk.ErrNoNode
	}
	if version != AnyVersion && version != c.version {
		return zk.ErrBadVersion
	}
	c.exists = false
	return nil
}

// nodeEphemeral is a connected session on a nodeConn and an ephemeral
// node /m created on it with data.
func nodeEphemeral(t *testing.T, data string) (*nodeConn, *Ephemeral) {
	t.Helper()
	c := &nodeConn{watched: make(chan struct{})}
	s := newSession(Config{}, ConnectString{})
	s.conn = c
	s.state = StateConnected
	e, err := s.CreateEphemeral(context.Background(), "/m", []byte(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	<-c.watched
	return c, e
}

// An update of an ephemeral node that lands while the session re-syncs the
// node after a reconnect (same session: the node is still there) is not
// overwritten with the data from before it. The re-sync read the data to
// write before the update and the node's version after it; that lost
// update left supervisors' member records without their fail-static
// episode after a whole-ensemble outage (issue 24).
func TestEphemeralUpdateDuringResyncIsKept(t *testing.T) {
	c, e := nodeEphemeral(t, "before")
	ctx := context.Background()
	c.mu.Lock()
	c.hook = func() {
		if err := e.Set(ctx, []byte("after")); err != nil {
			t.Errorf("update: %v", err)
		}
	}
	c.mu.Unlock()
	e.ensure() // what the re-sync runs on the return to Connected
	c.mu.Lock()
	defer c.mu.Unlock()
	if string(c.data) != "after" {
		t.Fatalf("the node holds %q after the re-sync (writes %q): the update was lost", c.data, c.writes)
	}
	if len(c.writes) != 2 {
		t.Fatalf("writes %q, want the create and the update only", c.writes)
	}
}

// An update made while the node is re-created on a new session (it finds
// no node yet, and the create had read the data before it) is what the
// re-created node ends up holding.
func TestEphemeralUpdateDuringRecreateIsKept(t *testing.T) {
	c, e := nodeEphemeral(t, "before")
	ctx := context.Background()
	c.mu.Lock()
	c.exists = false // the session expired: the node is gone
	c.hook = func() {
		if err := e.Set(ctx, []byte("after")); err == nil {
			t.Error("update of a node that is not there succeeded")
		}
	}
	c.mu.Unlock()
	e.ensure()
	c.mu.Lock()
	defer c.mu.Unlock()
	if string(c.data) != "after" {
		t.Fatalf("re-created node holds %q (writes %q), want the update", c.data, c.writes)
	}
}

// A node this session does not own is never written: after this session
// expired, another one (a supervisor started under the same member name)
// created it, and ZooKeeper checks no owner on a write. Overwriting it made
// two live supervisors of one name, each rewriting the other's record
// (found in the review of issue 24).
func TestEphemeralSetRefusesANodeOwnedByAnotherSession(t *testing.T) {
	c, e := nodeEphemeral(t, "mine")
	ctx := context.Background()
	c.mu.Lock()
	c.data, c.version, c.other = []byte("theirs"), 0, true // expired, and re-created by another session
	c.mu.Unlock()
	if err := e.Set(ctx, []byte("mine again")); !errors.Is(err, ErrOwnedElsewhere) {
		t.Fatalf("Set of another session's node: %v, want ErrOwnedElsewhere", err)
	}
	c.mu.Lock()
	data := string(c.data)
	c.other = false // ours again (say the other one went, and ours came back)
	c.mu.Unlock()
	if data != "theirs" {
		t.Fatalf("the other session's node holds %q", data)
	}
	if err := e.Set(ctx, []byte("ours")); err != nil {
		t.Fatalf("Set of our own node: %v", err)
	}
	c.mu.Lock()
	data = string(c.data)
	c.mu.Unlock()
	if data != "ours" {
		t.Fatalf("our node holds %q", data)
	}
	// Nor is another session's node deleted (a clean stop after the name
	// was taken: the supervisor's last act removed the other's record).
	c.mu.Lock()
	c.other = true
	c.mu.Unlock()
	if err := e.Delete(ctx); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.exists {
		t.Fatal("another session's node was deleted")
	}
}

// A Delete while the node is being re-created (after an expiry, by the
// re-sync or the guard: both may run) leaves no node behind. The create
// had checked that the node was wanted and was on its way to the server
// when Delete found nothing to delete; the node then came back for a
// process that had let it go (topo's TestPoolMemberRecreatedAfterExpiry
// failed in CI: a member record still there after Remove).
func TestEphemeralDeleteDuringRecreateLeavesNoNode(t *testing.T) {
	c, e := nodeEphemeral(t, "mine")
	ctx := context.Background()
	deleted := make(chan error, 1)
	c.mu.Lock()
	c.exists = false // the session expired: the node is gone
	c.hook = func() {
		go func() { deleted <- e.Delete(ctx) }()
		// Give the Delete the time to finish if it does not wait for the
		// create; when it waits, this is only a pause.
		select {
		case err := <-deleted:
			deleted <- err
		case <-time.After(100 * time.Millisecond):
		}
	}
	c.mu.Unlock()
	e.ensure()
	if err := <-deleted; err != nil {
		t.Fatalf("Delete: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exists {
		t.Fatalf("the node is there after Delete (writes %q)", c.writes)
	}
}
