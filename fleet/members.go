package fleet

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// MemberView follows the map version that every member of a cluster (each
// router, and each supervisor of every pool) has applied, with ZooKeeper
// watches: a children watch on the routers directory, on the pools
// directory and on each pool's members directory, and a data watch on each
// member record. When a watch fires, only its node is read again, so
// following N members costs one read per record change instead of N reads
// per poll. A member that appears is read and watched. One whose record
// vanishes after the view saw it still counts, at its last map version,
// until the record reappears or the view's grace (its session's timeout)
// has passed (Vanished says why); then it is forgotten.
//
// After a return of the session to Connected the session re-reads every
// watched node by itself (zksession.Watch), but only changed nodes are
// delivered, so the view cannot tell when that is over. Wait therefore lists
// the directories again (a few reads, not one per member) whenever the
// session came back during the wait, and once at its start: membership is
// never taken from a view that may have missed a join.
//
// It is safe for concurrent use; Close stops it (closing the session stops
// it too).
type MemberView struct {
	s      *zksession.Session
	p      topo.Paths
	cancel context.CancelFunc
	ctx    context.Context
	wg     sync.WaitGroup

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	closed  bool
	dirs    map[string]*memberDir   // by directory path: routers, each pool's members
	pools   map[string]*memberDir   // by pool name: its members directory
	members map[string]*memberState // by record path
	poolsAt int64                   // Pzxid of the pools directory last applied
	grace   time.Duration           // how long a vanished record counts; 0: the session's timeout
}

// memberDir is one watched members directory.
type memberDir struct {
	path   string
	decode func(at string, data []byte) (uint64, error)
	pzxid  int64 // of the newest listing applied
	stop   context.CancelFunc
}

// memberState is what the view knows of one member record.
type memberState struct {
	dir     *memberDir
	stop    context.CancelFunc
	read    bool // a read arrived (before that: not known to have applied anything)
	exists  bool
	version uint64
	err     error // the record does not decode
	// seen: its last version and, once its record watch found it gone
	// after it was there, when (see Vanished).
	seen Seen
	// unlisted: the newest listing of its directory lacks it. A vanished
	// member is forgotten after the grace only then; otherwise its record
	// is back in the listing and its watch is about to say so.
	unlisted bool
}

func routerVersion(at string, data []byte) (uint64, error) {
	rec, err := topo.DecodeRouterMember(at, data)
	return AppliedVersion(topo.Entry[topo.RouterMember]{Path: at, Rec: rec, Err: err})
}

func poolMemberVersion(at string, data []byte) (uint64, error) {
	rec, err := topo.DecodePoolMember(at, data)
	return AppliedVersion(topo.Entry[topo.PoolMember]{Path: at, Rec: rec, Err: err})
}

// WatchMembers starts a view of the cluster's members. It returns at once;
// the first reads arrive in the background (Wait lists what it needs).
func WatchMembers(ctx context.Context, s *zksession.Session, p topo.Paths) *MemberView {
	return watchMembers(ctx, s, p, 0)
}

// watchMembers is WatchMembers with a grace for vanished records other
// than the session's timeout (tests: 0 keeps the session's).
func watchMembers(ctx context.Context, s *zksession.Session, p topo.Paths, grace time.Duration) *MemberView {
	ctx, cancel := context.WithCancel(ctx)
	v := &MemberView{s: s, p: p, ctx: ctx, cancel: cancel, changed: make(chan struct{}), grace: grace,
		dirs: map[string]*memberDir{}, pools: map[string]*memberDir{}, members: map[string]*memberState{}}
	v.mu.Lock()
	v.addDirLocked(p.Routers(), routerVersion)
	v.mu.Unlock()
	v.follow(topo.WatchPools(ctx, s, p), ctx, func(n zksession.Node) { v.applyPools(n.Exists, n.Children, n.Stat.Pzxid) })
	// The session's watches end when it closes; so does the view, so that
	// a caller that never calls Close leaks nothing past the session.
	sub := s.Subscribe()
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		defer sub.Close()
		for {
			select {
			case _, ok := <-sub.C:
				if !ok {
					cancel()
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return v
}

// Close stops every watch of the view and waits for them.
func (v *MemberView) Close() {
	v.mu.Lock()
	if !v.closed {
		v.closed = true
		v.notifyLocked() // waiters return at once
	}
	v.mu.Unlock()
	v.cancel()
	v.wg.Wait()
}

// follow delivers w's nodes to apply until ctx ends, then stops w.
func (v *MemberView) follow(w *zksession.Watch, ctx context.Context, apply func(zksession.Node)) {
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case n := <-w.C:
				apply(n)
			}
		}
	}()
}

// notifyLocked wakes every waiter.
func (v *MemberView) notifyLocked() {
	close(v.changed)
	v.changed = make(chan struct{})
}

// addDirLocked starts following a members directory.
func (v *MemberView) addDirLocked(dir string, decode func(string, []byte) (uint64, error)) *memberDir {
	ctx, stop := context.WithCancel(v.ctx)
	d := &memberDir{path: dir, decode: decode, stop: stop}
	v.dirs[dir] = d
	v.follow(topo.WatchMemberDir(ctx, v.s, dir), ctx, func(n zksession.Node) { v.applyDir(d, n.Exists, n.Children, n.Stat.Pzxid) })
	return d
}

// removeDirLocked stops following a directory; its members are unlisted.
func (v *MemberView) removeDirLocked(d *memberDir) {
	d.stop()
	delete(v.dirs, d.path)
	now := time.Now()
	for at, m := range v.members {
		if path.Dir(at) == d.path {
			v.unlistLocked(at, m, now)
		}
	}
}

// unlistLocked applies a listing without the member's record. A member
// not known to have been there, or vanished longer than the grace ago, is
// forgotten. One that was there is kept: its record watch says when it
// vanished, and it counts from then for the grace (a listing alone, which
// may be older than the record's reappearance, never ends it).
func (v *MemberView) unlistLocked(at string, m *memberState, now time.Time) {
	m.unlisted = true
	if m.exists {
		return
	}
	if _, counts := Vanished(at, m.seen, now, v.graceLocked()); !counts {
		m.stop()
		delete(v.members, at)
	}
}

// graceLocked is how long a vanished record counts: the view's session
// timeout. A live owner re-creates its record within a round trip
// (zksession.Ephemeral), and a session that could not has expired by then.
func (v *MemberView) graceLocked() time.Duration {
	if v.grace > 0 {
		return v.grace
	}
	return v.s.SessionTimeout()
}

// applyPools applies a listing of the pools directory. A listing older
// than one already applied (a smaller Pzxid: it was read before) only adds
// pools, never removes one, so that a late delivery cannot hide a pool.
func (v *MemberView) applyPools(exists bool, names []string, pzxid int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return
	}
	authoritative := !exists || pzxid >= v.poolsAt
	if exists && pzxid > v.poolsAt {
		v.poolsAt = pzxid
	}
	if authoritative {
		for name, d := range v.pools {
			if !slices.Contains(names, name) {
				v.removeDirLocked(d)
				delete(v.pools, name)
			}
		}
	}
	for _, name := range names {
		if _, ok := v.pools[name]; !ok {
			v.pools[name] = v.addDirLocked(v.p.PoolMembers(name), poolMemberVersion)
		}
	}
	v.notifyLocked()
}

// applyDir applies a listing of a members directory, as applyPools does.
func (v *MemberView) applyDir(d *memberDir, exists bool, names []string, pzxid int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed || v.dirs[d.path] != d {
		return // stopped meanwhile
	}
	authoritative := !exists || pzxid >= d.pzxid
	if exists && pzxid > d.pzxid {
		d.pzxid = pzxid
	}
	if authoritative {
		now := time.Now()
		for at, m := range v.members {
			if path.Dir(at) != d.path {
				continue
			}
			if slices.Contains(names, path.Base(at)) {
				m.unlisted = false
			} else {
				v.unlistLocked(at, m, now)
			}
		}
	}
	for _, name := range names {
		at := path.Join(d.path, name)
		if _, ok := v.members[at]; ok {
			continue
		}
		ctx, stop := context.WithCancel(v.ctx)
		m := &memberState{dir: d, stop: stop}
		v.members[at] = m
		v.follow(topo.WatchMemberRecord(ctx, v.s, at), ctx, func(n zksession.Node) { v.applyMember(at, m, n) })
	}
	v.notifyLocked()
}

// applyMember records a member record as read: there, or gone. A record
// that was there and is gone has vanished (see Vanished): its last version
// stays.
func (v *MemberView) applyMember(at string, m *memberState, n zksession.Node) {
	var ver uint64
	var err error
	if n.Exists {
		ver, err = m.dir.decode(at, n.Data)
	}
	now := time.Now()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.members[at] != m {
		return // forgotten meanwhile
	}
	switch {
	case n.Exists:
		m.seen = Seen{MapVersion: ver, LastSeen: now}
	case m.exists:
		// The watch saw it there until now.
		m.seen.GoneAt, m.seen.LastSeen = now, now
	}
	m.read, m.exists, m.version, m.err = true, n.Exists, ver, err
	v.notifyLocked()
}

// Behind lists, sorted by path, the members not known to have applied map
// version: a record at a lower version (MapVersion says which), a record
// that does not decode, or one not read yet (Error says so), and a record
// that vanished at a lower version within the grace (Error says when). A
// member whose record was never seen there, or vanished longer ago than
// the grace, is not listed: it serves nobody.
func (v *MemberView) Behind(version uint64) []topo.Straggler {
	v.mu.Lock()
	defer v.mu.Unlock()
	behind, _ := v.behindLocked(version, time.Now())
	return behind
}

// behindLocked is Behind at now, and when the next vanished member's
// grace ends (zero if none counts), after which the answer may change.
func (v *MemberView) behindLocked(version uint64, now time.Time) (behind []topo.Straggler, next time.Time) {
	members, next := v.countLocked(now)
	return Stragglers(members, version), next
}

// countLocked lists the members that count at now, forgetting those whose
// grace has passed and that no listing has any more, and says when the
// next vanished member's grace ends.
func (v *MemberView) countLocked(now time.Time) (members []Applied, next time.Time) {
	grace := v.graceLocked()
	members = make([]Applied, 0, len(v.members))
	for at, m := range v.members {
		switch {
		case !m.read:
			members = append(members, Applied{Path: at, Err: errNotRead})
		case m.exists:
			members = append(members, Applied{Path: at, MapVersion: m.version, Err: m.err})
		case !m.seen.GoneAt.IsZero():
			a, counts := Vanished(at, m.seen, now, grace)
			if !counts {
				if m.unlisted {
					m.stop()
					delete(v.members, at)
				}
				continue
			}
			members = append(members, a)
			if end := m.seen.GoneAt.Add(grace); next.IsZero() || end.Before(next) {
				next = end
			}
		}
	}
	return members, next
}

var errNotRead = errors.New("record not read yet")

// Members reports how many members count now: records there or not read
// yet, and vanished ones within the grace.
func (v *MemberView) Members() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	members, _ := v.countLocked(time.Now())
	return len(members)
}

// Wait blocks until every member has applied map version, and returns nil,
// nil then; a vanished member counts until its record reappears or its
// grace ends (see Vanished). If some have not when timeout has passed, it returns them
// (Behind) and no error. It lists the directories at its start and again
// after every return of the session to Connected (see MemberView); if no
// listing succeeded before the timeout, membership is unknown and Wait
// fails with the listing's error. It fails with ctx's error if ctx ends.
func (v *MemberView) Wait(ctx context.Context, version uint64, timeout time.Duration) ([]topo.Straggler, error) {
	sub := v.s.Subscribe()
	defer sub.Close()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var (
		listed  bool
		listErr error
		retry   <-chan time.Time
	)
	for {
		if !listed {
			if listErr = v.refresh(wctx); listErr == nil {
				listed, retry = true, nil
			} else {
				retry = time.After(100 * time.Millisecond)
			}
		}
		v.mu.Lock()
		changed := v.changed
		var behind []topo.Straggler
		var expiry <-chan time.Time // a vanished member's grace ends: it counts no more
		if listed {
			var next time.Time
			if behind, next = v.behindLocked(version, time.Now()); !next.IsZero() {
				expiry = time.After(time.Until(next))
			}
		}
		closed := v.closed
		v.mu.Unlock()
		if closed {
			return nil, errors.New("member view is closed")
		}
		if listed && len(behind) == 0 {
			return nil, nil
		}
		select {
		case <-changed:
		case <-expiry:
		case <-retry:
		case ch, ok := <-sub.C:
			if !ok {
				return nil, zksession.ErrClosed
			}
			if ch.To == zksession.StateConnected {
				listed = false // the view may have missed joins meanwhile
			}
		case <-deadline.C:
			if !listed {
				return nil, fmt.Errorf("members not known after %s: %w", timeout, listErr)
			}
			return behind, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// refresh lists the routers directory, the pools directory and each
// pool's members directory, and applies what it finds (adding members the
// watches have not delivered yet). Its reads: 2 plus one per pool.
func (v *MemberView) refresh(ctx context.Context) error {
	// A directory that does not exist has no members to add; removals
	// are left to the watches, whose deliveries are ordered.
	list := func(dir string) ([]string, int64, bool, error) { return topo.ListMemberDir(ctx, v.s, dir) }
	pools, pz, ok, err := list(v.p.Pools())
	if err != nil {
		return err
	}
	if ok {
		v.applyPools(true, pools, pz)
	}
	dirs := []string{v.p.Routers()}
	for _, pool := range pools {
		dirs = append(dirs, v.p.PoolMembers(pool))
	}
	for _, dir := range dirs {
		names, pz, ok, err := list(dir)
		if err != nil {
			return err
		}
		v.mu.Lock()
		d := v.dirs[dir]
		v.mu.Unlock()
		if ok && d != nil {
			v.applyDir(d, true, names, pz)
		}
	}
	return nil
}
