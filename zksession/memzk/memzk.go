// Package memzk is an in-memory ZooKeeper for tests: a Server holds one
// znode tree, and each Conn is a client session on it with ZooKeeper's
// semantics where shardvisor depends on them: znode versions and
// compare-and-swap, ephemeral nodes owned by their session, sequential
// nodes, one-shot data and child watches, atomic multi, zxids that order
// every change. A zksession.Session opened on it (Server.Open) runs the
// same code as on ZooKeeper above the connection, so topology, routing,
// planning and rebalancing decisions are tested without servers.
//
// It also does what is awkward with real servers: Disconnect cuts one
// session off (its calls block, like go-zookeeper's queue), Reconnect heals
// it, and Expire ends a session as the ensemble does after its timeout,
// deleting its ephemeral nodes and firing the watches that sees.
//
// What it does not model, and the real-ZooKeeper tests keep: ACL
// enforcement and digest authentication (ACLs are stored and returned,
// never checked), quorum and leader changes, the wire protocol, and a
// session timeout that runs out by itself (only Expire ends a session).
package memzk

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/zksession"
)

// Server is one in-memory ensemble. The zero value is not usable: use New.
type Server struct {
	mu       sync.Mutex
	zxid     int64
	nodes    map[string]*node
	ghosts   map[string][]*watcher // ExistsW on paths that do not exist yet
	nextID   int64
	sessions map[int64]*Conn
}

// watcher is one armed one-shot watch: it gets one event, then is closed,
// as go-zookeeper's watch channels are.
type watcher struct {
	ch   chan zk.Event
	done bool
}

func (w *watcher) send(ev zk.Event) {
	if w.done {
		return
	}
	w.done = true
	w.ch <- ev // buffered 1, sent once
	close(w.ch)
}

type node struct {
	data   []byte
	acl    []zk.ACL
	stat   zk.Stat
	kids   map[string]struct{}
	seq    int32 // next sequential suffix
	dataW  []*watcher
	childW []*watcher
}

// New returns a server whose tree holds only "/" (and "/zookeeper", as a
// real ensemble's does).
func New() *Server {
	s := &Server{nodes: map[string]*node{}, ghosts: map[string][]*watcher{}, sessions: map[int64]*Conn{}, nextID: 0x1000}
	s.nodes["/"] = &node{kids: map[string]struct{}{}, acl: zk.WorldACL(zk.PermAll)}
	s.createLocked("/zookeeper", nil, 0, zk.WorldACL(zk.PermAll), 0)
	return s
}

// Open starts a zksession.Session on a new connection to this server. The
// session connects at once; cfg.Connect may be empty or carry a chroot
// ("/chroot" alone is not a connect string: use "mem:1/chroot").
func (s *Server) Open(cfg zksession.Config) (*zksession.Session, error) {
	return zksession.OpenConn(cfg, func(onEvent func(zk.Event)) (zksession.Conn, error) {
		return s.Connect(onEvent), nil
	})
}

// Connect opens a connection with a new session. onEvent (nil: none) gets
// the session's events in order: StateHasSession now, and later
// StateDisconnected, StateExpired and StateHasSession as Disconnect,
// Reconnect and Expire say.
func (s *Server) Connect(onEvent func(zk.Event)) *Conn {
	c := &Conn{srv: s, onEvent: onEvent, events: make(chan zk.Event, 64), evDone: make(chan struct{}), up: make(chan struct{})}
	close(c.up)
	go c.deliver()
	s.mu.Lock()
	c.newSessionLocked()
	s.mu.Unlock()
	c.event(zk.StateConnected)
	c.event(zk.StateHasSession)
	return c
}

// Sessions lists the ids of the sessions alive now.
func (s *Server) Sessions() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []int64
	for id := range s.sessions {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Conn is one client connection and its current session. It implements
// zksession.Conn.
type Conn struct {
	srv     *Server
	onEvent func(zk.Event)
	events  chan zk.Event
	evDone  chan struct{}

	// guarded by srv.mu
	id       int64
	closed   bool
	expired  bool          // the session ended while disconnected
	up       chan struct{} // closed while connected
	watchers []*watcher
}

var _ zksession.Conn = (*Conn)(nil)

func (c *Conn) newSessionLocked() {
	c.srv.nextID++
	c.id = c.srv.nextID
	c.srv.sessions[c.id] = c
}

// event queues a session event; deliver hands them over in order on a
// goroutine of the connection's, as go-zookeeper does.
func (c *Conn) event(st zk.State) {
	select {
	case c.events <- zk.Event{Type: zk.EventSession, State: st, Server: "memzk"}:
	default: // a reader 64 events behind: drop, as the states are sticky
	}
}

func (c *Conn) deliver() {
	defer close(c.evDone)
	for ev := range c.events {
		if c.onEvent != nil {
			c.onEvent(ev)
		}
	}
}

// Disconnect cuts the connection off: its calls block until Reconnect (or
// Close), as go-zookeeper queues them, and its session's watches stay armed.
func (c *Conn) Disconnect() {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	select {
	case <-c.up:
	default:
		return // already down
	}
	if c.closed {
		return
	}
	c.up = make(chan struct{})
	c.event(zk.StateDisconnected)
}

// Reconnect heals Disconnect. If the session was expired meanwhile, the
// client learns it now (StateExpired) and gets a new session, as a real
// client does.
func (c *Conn) Reconnect() {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	select {
	case <-c.up:
		return
	default:
	}
	if c.closed {
		return
	}
	if c.expired {
		c.expired = false
		c.event(zk.StateExpired)
		c.newSessionLocked()
	}
	close(c.up)
	c.event(zk.StateConnected)
	c.event(zk.StateHasSession)
}

// Expire ends the connection's session as the ensemble does when its
// timeout runs out: its ephemeral nodes go, its watches end. A connected
// client learns it at once and gets a new session; a disconnected one on
// Reconnect.
func (c *Conn) Expire() {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	if c.closed {
		return
	}
	c.srv.endSessionLocked(c)
	select {
	case <-c.up:
		c.event(zk.StateDisconnected)
		c.event(zk.StateExpired)
		c.newSessionLocked()
		c.event(zk.StateConnected)
		c.event(zk.StateHasSession)
	default:
		c.expired = true
	}
}

// endSessionLocked deletes the session's ephemeral nodes and ends its
// watches.
func (s *Server) endSessionLocked(c *Conn) {
	var eph []string
	for p, n := range s.nodes {
		if n.stat.EphemeralOwner == c.id {
			eph = append(eph, p)
		}
	}
	slices.Sort(eph)
	for _, p := range eph {
		_ = s.deleteLocked(p, -1)
	}
	for _, w := range c.watchers {
		w.send(zk.Event{Type: zk.EventNotWatching, State: zk.StateDisconnected, Err: zk.ErrSessionExpired})
	}
	c.watchers = nil
	delete(s.sessions, c.id)
}

// Close ends the session (its ephemeral nodes go at once) and the
// connection; calls then fail with zk.ErrClosing.
func (c *Conn) Close() {
	c.srv.mu.Lock()
	if c.closed {
		c.srv.mu.Unlock()
		return
	}
	c.closed = true
	c.srv.endSessionLocked(c)
	select {
	case <-c.up:
	default:
		close(c.up) // wake blocked calls: they see closed
	}
	close(c.events)
	c.srv.mu.Unlock()
	<-c.evDone
}

// SessionID is the current session's id.
func (c *Conn) SessionID() int64 {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	return c.id
}

// Server names the in-memory server.
func (c *Conn) Server() string { return "memzk" }

// AddAuth is accepted and ignored: memzk does not enforce ACLs.
func (c *Conn) AddAuth(scheme string, auth []byte) error { return nil }

// lock waits until the connection is up and takes the server's lock.
func (c *Conn) lock() error {
	for {
		c.srv.mu.Lock()
		if c.closed {
			c.srv.mu.Unlock()
			return zk.ErrClosing
		}
		up := c.up
		select {
		case <-up:
			return nil
		default:
		}
		c.srv.mu.Unlock()
		<-up
	}
}

func validPath(p string) error {
	if p == "" || p[0] != '/' || (len(p) > 1 && strings.HasSuffix(p, "/")) || strings.Contains(p, "//") {
		return zk.ErrInvalidPath
	}
	return nil
}

func (s *Server) stat(n *node) *zk.Stat {
	st := n.stat
	st.DataLength = int32(len(n.data))
	st.NumChildren = int32(len(n.kids))
	return &st
}

// Get reads a node.
func (c *Conn) Get(p string) ([]byte, *zk.Stat, error) {
	d, st, _, err := c.get(p, false)
	return d, st, err
}

// GetW reads a node and arms a data watch on it.
func (c *Conn) GetW(p string) ([]byte, *zk.Stat, <-chan zk.Event, error) {
	return c.get(p, true)
}

func (c *Conn) get(p string, watch bool) (data []byte, st *zk.Stat, ev <-chan zk.Event, err error) {
	err = c.at(p, func(n *node) error {
		data, st = slices.Clone(n.data), c.srv.stat(n)
		if watch {
			ev = c.arm(&n.dataW)
		}
		return nil
	})
	return data, st, ev, err
}

// do validates p and runs f under the server's lock once the connection is
// up: every call's common prologue.
func (c *Conn) do(p string, f func() error) error {
	if err := validPath(p); err != nil {
		return err
	}
	if err := c.lock(); err != nil {
		return err
	}
	defer c.srv.mu.Unlock()
	return f()
}

// at is do on p's node (zk.ErrNoNode if there is none).
func (c *Conn) at(p string, f func(n *node) error) error {
	return c.do(p, func() error {
		n, ok := c.srv.nodes[p]
		if !ok {
			return zk.ErrNoNode
		}
		return f(n)
	})
}

// arm adds a one-shot watch to ws.
func (c *Conn) arm(ws *[]*watcher) <-chan zk.Event {
	// Fired watchers are dropped here so a long-lived session does not
	// accumulate them.
	c.watchers = slices.DeleteFunc(c.watchers, func(w *watcher) bool { return w.done })
	w := &watcher{ch: make(chan zk.Event, 1)}
	c.watchers = append(c.watchers, w)
	*ws = append(*ws, w)
	return w.ch
}

// Exists reports whether a node exists.
func (c *Conn) Exists(p string) (bool, *zk.Stat, error) {
	ok, st, _, err := c.exists(p, false)
	return ok, st, err
}

// ExistsW is Exists arming a data watch that also fires on creation.
func (c *Conn) ExistsW(p string) (bool, *zk.Stat, <-chan zk.Event, error) {
	return c.exists(p, true)
}

func (c *Conn) exists(p string, watch bool) (ok bool, st *zk.Stat, ev <-chan zk.Event, err error) {
	err = c.do(p, func() error {
		n, found := c.srv.nodes[p]
		ok, st = found, &zk.Stat{}
		switch {
		case found && watch:
			ev = c.arm(&n.dataW)
		case watch:
			ghosts := c.srv.ghosts[p]
			ev = c.arm(&ghosts)
			c.srv.ghosts[p] = ghosts
		}
		if found {
			st = c.srv.stat(n)
		}
		return nil
	})
	return ok, st, ev, err
}

// Children lists a node's children, sorted.
func (c *Conn) Children(p string) ([]string, *zk.Stat, error) {
	k, st, _, err := c.children(p, false)
	return k, st, err
}

// ChildrenW lists a node's children and arms a child watch.
func (c *Conn) ChildrenW(p string) ([]string, *zk.Stat, <-chan zk.Event, error) {
	return c.children(p, true)
}

func (c *Conn) children(p string, watch bool) (kids []string, st *zk.Stat, ev <-chan zk.Event, err error) {
	err = c.at(p, func(n *node) error {
		kids = make([]string, 0, len(n.kids))
		for k := range n.kids {
			kids = append(kids, k)
		}
		slices.Sort(kids)
		st = c.srv.stat(n)
		if watch {
			ev = c.arm(&n.childW)
		}
		return nil
	})
	return kids, st, ev, err
}

// Create makes a node; flags as zk.FlagEphemeral and zk.FlagSequence.
func (c *Conn) Create(p string, data []byte, flags int32, acl []zk.ACL) (name string, err error) {
	err = c.do(p, func() error {
		name, err = c.srv.createChecked(p, data, flags, acl, c.id)
		return err
	})
	return name, err
}

func (s *Server) createChecked(p string, data []byte, flags int32, acl []zk.ACL, owner int64) (string, error) {
	if err := validPath(p); err != nil || p == "/" {
		return "", zk.ErrInvalidPath
	}
	if len(acl) == 0 {
		return "", zk.ErrInvalidACL
	}
	parent, ok := s.nodes[path.Dir(p)]
	if !ok {
		return "", zk.ErrNoNode
	}
	if parent.stat.EphemeralOwner != 0 {
		return "", zk.ErrNoChildrenForEphemerals
	}
	if flags&zk.FlagSequence != 0 {
		p = fmt.Sprintf("%s%010d", p, parent.seq)
	}
	if _, ok := s.nodes[p]; ok {
		return "", zk.ErrNodeExists
	}
	var eo int64
	if flags&zk.FlagEphemeral != 0 {
		eo = owner
	}
	return s.createLocked(p, data, flags, acl, eo), nil
}

func (s *Server) createLocked(p string, data []byte, flags int32, acl []zk.ACL, owner int64) string {
	s.zxid++
	now := time.Now().UnixMilli()
	n := &node{data: slices.Clone(data), acl: slices.Clone(acl), kids: map[string]struct{}{},
		stat: zk.Stat{Czxid: s.zxid, Mzxid: s.zxid, Pzxid: s.zxid, Ctime: now, Mtime: now, EphemeralOwner: owner}}
	s.nodes[p] = n
	parent := s.nodes[path.Dir(p)]
	parent.kids[path.Base(p)] = struct{}{}
	parent.seq++
	parent.stat.Cversion++
	parent.stat.Pzxid = s.zxid
	if g, ok := s.ghosts[p]; ok {
		delete(s.ghosts, p)
		fire(&g, zk.EventNodeCreated, p)
	}
	fire(&parent.childW, zk.EventNodeChildrenChanged, path.Dir(p))
	return p
}

func fire(ws *[]*watcher, t zk.EventType, p string) {
	for _, w := range *ws {
		w.send(zk.Event{Type: t, State: zk.StateHasSession, Path: p})
	}
	*ws = nil
}

// Set writes a node's data if its version is still version (-1: any).
func (c *Conn) Set(p string, data []byte, version int32) (st *zk.Stat, err error) {
	err = c.do(p, func() error {
		st, err = c.srv.setLocked(p, data, version)
		return err
	})
	return st, err
}

func (s *Server) setLocked(p string, data []byte, version int32) (*zk.Stat, error) {
	n, ok := s.nodes[p]
	if !ok || p == "" || p[0] != '/' {
		return nil, zk.ErrNoNode
	}
	if version != -1 && version != n.stat.Version {
		return nil, zk.ErrBadVersion
	}
	s.zxid++
	n.data = slices.Clone(data)
	n.stat.Version++
	n.stat.Mzxid = s.zxid
	n.stat.Mtime = time.Now().UnixMilli()
	fire(&n.dataW, zk.EventNodeDataChanged, p)
	return s.stat(n), nil
}

// Delete removes a node without children if its version is still version.
func (c *Conn) Delete(p string, version int32) error {
	return c.do(p, func() error { return c.srv.deleteLocked(p, version) })
}

func (s *Server) deleteLocked(p string, version int32) error {
	n, ok := s.nodes[p]
	if !ok || p == "/" || p == "" || p[0] != '/' {
		if p == "/" {
			return zk.ErrBadArguments
		}
		return zk.ErrNoNode
	}
	if version != -1 && version != n.stat.Version {
		return zk.ErrBadVersion
	}
	if len(n.kids) > 0 {
		return zk.ErrNotEmpty
	}
	s.zxid++
	delete(s.nodes, p)
	parent := s.nodes[path.Dir(p)]
	delete(parent.kids, path.Base(p))
	parent.stat.Cversion++
	parent.stat.Pzxid = s.zxid
	fire(&n.dataW, zk.EventNodeDeleted, p)
	fire(&n.childW, zk.EventNodeDeleted, p)
	fire(&parent.childW, zk.EventNodeChildrenChanged, path.Dir(p))
	return nil
}

// Multi applies the operations all or none. On failure the failing
// operation's response carries its error, the ones after it
// zk.ErrAPIError (rolled back), and the call returns the first error.
func (c *Conn) Multi(ops ...any) ([]zk.MultiResponse, error) {
	if err := c.lock(); err != nil {
		return nil, err
	}
	defer c.srv.mu.Unlock()
	s := c.srv
	// Apply on a copy of the tree (nodes are copied on first touch), so a
	// failure leaves the real one untouched and fires no watch.
	shadow := &Server{zxid: s.zxid, nodes: map[string]*node{}, ghosts: map[string][]*watcher{}, sessions: s.sessions}
	for p, n := range s.nodes {
		cp := *n
		cp.kids = make(map[string]struct{}, len(n.kids))
		for k := range n.kids {
			cp.kids[k] = struct{}{}
		}
		cp.dataW, cp.childW = nil, nil
		shadow.nodes[p] = &cp
	}
	resp := make([]zk.MultiResponse, len(ops))
	fail := func(i int, err error) ([]zk.MultiResponse, error) {
		for j := range resp {
			switch {
			case j < i:
				resp[j] = zk.MultiResponse{}
			case j == i:
				resp[j] = zk.MultiResponse{Error: err}
			default:
				resp[j] = zk.MultiResponse{Error: zk.ErrAPIError}
			}
		}
		return resp, err
	}
	for i, op := range ops {
		switch o := op.(type) {
		case *zk.CheckVersionRequest:
			n, ok := shadow.nodes[o.Path]
			if !ok {
				return fail(i, zk.ErrNoNode)
			}
			if o.Version != -1 && o.Version != n.stat.Version {
				return fail(i, zk.ErrBadVersion)
			}
			resp[i] = zk.MultiResponse{Stat: shadow.stat(n)}
		case *zk.CreateRequest:
			p, err := shadow.createChecked(o.Path, o.Data, o.Flags, o.Acl, c.id)
			if err != nil {
				return fail(i, err)
			}
			resp[i] = zk.MultiResponse{String: p}
		case *zk.SetDataRequest:
			st, err := shadow.setLocked(o.Path, o.Data, o.Version)
			if err != nil {
				return fail(i, err)
			}
			resp[i] = zk.MultiResponse{Stat: st}
		case *zk.DeleteRequest:
			if err := shadow.deleteLocked(o.Path, o.Version); err != nil {
				return fail(i, err)
			}
			resp[i] = zk.MultiResponse{}
		default:
			return fail(i, fmt.Errorf("memzk: multi operation %d has unknown type %T", i, op))
		}
	}
	// Everything applies: replay on the real tree so that watches fire.
	for _, op := range ops {
		var err error
		switch o := op.(type) {
		case *zk.CreateRequest:
			_, err = s.createChecked(o.Path, o.Data, o.Flags, o.Acl, c.id)
		case *zk.SetDataRequest:
			_, err = s.setLocked(o.Path, o.Data, o.Version)
		case *zk.DeleteRequest:
			err = s.deleteLocked(o.Path, o.Version)
		}
		if err != nil {
			panic(fmt.Sprintf("memzk: multi replay diverged from its dry run: %v", err))
		}
	}
	return resp, nil
}

// Sync returns at once: one in-memory tree is always up to date.
func (c *Conn) Sync(p string) (string, error) {
	return p, c.do(p, func() error { return nil })
}

// GetACL returns the stored ACL.
func (c *Conn) GetACL(p string) (acl []zk.ACL, st *zk.Stat, err error) {
	err = c.at(p, func(n *node) error {
		acl, st = slices.Clone(n.acl), c.srv.stat(n)
		return nil
	})
	return acl, st, err
}

// SetACL stores an ACL (not enforced) if the ACL version is still version.
func (c *Conn) SetACL(p string, acl []zk.ACL, version int32) (st *zk.Stat, err error) {
	err = c.at(p, func(n *node) error {
		if len(acl) == 0 {
			return zk.ErrInvalidACL
		}
		if version != -1 && version != n.stat.Aversion {
			return zk.ErrBadVersion
		}
		c.srv.zxid++
		n.acl = slices.Clone(acl)
		n.stat.Aversion++
		st = c.srv.stat(n)
		return nil
	})
	return st, err
}

// ErrUnknownConn is returned by ConnOf for a session not opened here.
var ErrUnknownConn = errors.New("memzk: the session is not on this server")

// ConnOf finds the connection of a session opened by Open, for Disconnect,
// Reconnect and Expire.
func (s *Server) ConnOf(id int64) (*Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.sessions[id]
	if !ok {
		return nil, ErrUnknownConn
	}
	return c, nil
}
