package zksession

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/zap"
)

// State is the health of a Session; see the package documentation.
type State int32

const (
	StateLost State = iota
	StateSuspended
	StateConnected
	StateClosed
)

func (s State) String() string {
	switch s {
	case StateLost:
		return "lost"
	case StateSuspended:
		return "suspended"
	case StateConnected:
		return "connected"
	case StateClosed:
		return "closed"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// StateChange is one transition of a Session's state.
type StateChange struct {
	From, To  State
	At        time.Time
	SessionID int64
	// NewSession is set on a transition to Connected whose session differs
	// from the one last connected: the old one expired, and with it this
	// process's ephemeral nodes and watches.
	NewSession bool
	Reason     string
}

// Session is one ZooKeeper session shared by a whole process. It is safe for
// concurrent use.
type Session struct {
	cfg    Config
	cs     ConnectString
	conn   Conn
	log    *zap.Logger
	hosts  *jitterHosts
	closed chan struct{}
	done   chan struct{}
	kick   chan struct{}

	negotiated atomic.Int64 // ns; 0 until the first connect response
	// cur is the connection to the server now tried or used (nil on a
	// Conn of the caller's, OpenConn): the monitor closes it when the
	// server stops answering, and the library moves to the next server.
	cur    atomic.Pointer[sniffConn]
	lastOK atomic.Int64 // unix ns of the last call answered by a server
	frozen atomic.Int64 // connections given up on: the server stopped answering

	evMu    sync.Mutex
	zkState zk.State
	expired bool   // sticky until the monitor sees it
	drops   uint64 // disconnects so far; a blip shorter than a monitor wakeup still counts

	mu          sync.Mutex
	state       State
	stateSince  time.Time
	timeIn      [4]time.Duration
	subs        map[*Subscription]struct{}
	connectedID int64 // session id at the last transition to Connected
	ephemerals  map[string]*Ephemeral
	resyncs     map[chan struct{}]struct{} // watches waiting for a re-read
	resyncWG    sync.WaitGroup

	values sync.Map // Value, SetValue

	requests sync.Map // op name -> *atomic.Int64; Requests
}

// Open starts a session on a ZooKeeper ensemble. It returns at once; the
// session connects in the background and starts in StateLost. Use
// WaitConnected to block until it is usable.
func Open(cfg Config) (*Session, error) {
	cs, err := ParseConnect(cfg.Connect)
	if err != nil {
		return nil, err
	}
	s := newSession(cfg, cs)
	conn, _, err := zk.Connect(cs.Servers, s.cfg.SessionTimeout,
		zk.WithHostProvider(s.hosts),
		zk.WithDialer(sniffingDialer(s.cfg.Dial, dialHooks{
			onTimeout: func(d time.Duration) { s.negotiated.Store(int64(d)) },
			handshake: s.handshakeBound,
			onConn:    s.cur.Store,
			onFail:    s.handshakeFailed,
		})),
		zk.WithLogger(zapLogger{s.log}),
		zk.WithLogInfo(false),
		zk.WithEventCallback(s.onEvent),
	)
	if err != nil {
		return nil, fmt.Errorf("zookeeper %s: %w", cs, err)
	}
	if err := s.start(conn); err != nil {
		return nil, err
	}
	return s, nil
}

// Connector opens the Conn a Session runs on. It must pass every session
// event (zk.EventSession: connected, disconnected, expired) to onEvent in
// order, without blocking on it.
type Connector func(onEvent func(zk.Event)) (Conn, error)

// OpenConn starts a session on a Conn of the caller's, such as an in-memory
// server's (package memzk): everything above the connection (states,
// watches, locks, ephemerals) is the same code as on ZooKeeper. cfg.Connect
// may be empty; a chroot in it is honoured.
func OpenConn(cfg Config, connect Connector) (*Session, error) {
	var cs ConnectString
	if cfg.Connect != "" {
		var err error
		if cs, err = ParseConnect(cfg.Connect); err != nil {
			return nil, err
		}
	}
	s := newSession(cfg, cs)
	conn, err := connect(s.onEvent)
	if err != nil {
		return nil, err
	}
	if err := s.start(conn); err != nil {
		return nil, err
	}
	return s, nil
}

func newSession(cfg Config, cs ConnectString) *Session {
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = DefaultOpTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.ACL == nil {
		cfg.ACL = zk.WorldACL(zk.PermAll)
	}
	return &Session{
		cfg:        cfg,
		cs:         cs,
		log:        cfg.Logger.With(zap.String("component", "zksession")),
		hosts:      newJitterHosts(2 * time.Second),
		closed:     make(chan struct{}),
		done:       make(chan struct{}),
		kick:       make(chan struct{}, 1),
		state:      StateLost,
		stateSince: time.Now(),
		subs:       map[*Subscription]struct{}{},
		ephemerals: map[string]*Ephemeral{},
		resyncs:    map[chan struct{}]struct{}{},
	}
}

// start adds the credentials to a new connection and starts the monitor.
func (s *Session) start(conn Conn) error {
	s.evMu.Lock() // the monitor reads conn under evMu
	s.conn = conn
	s.evMu.Unlock()
	var auth []Credential
	for _, c := range s.cfg.Auth {
		rc, err := RecordsCredential(c.DigestID())
		if err != nil {
			conn.Close()
			return err
		}
		auth = append(auth, c, rc)
	}
	for _, c := range auth {
		// The library queues AddAuth until connected and re-sends it on
		// every reconnect, so this is not racing the connection.
		go func(c Credential) {
			if err := conn.AddAuth("digest", []byte(c.User+":"+c.Password)); err != nil && !errors.Is(err, zk.ErrClosing) {
				s.log.Error("zookeeper auth failed", zap.Stringer("identity", c), zap.Error(err))
			}
		}(c)
	}
	go s.monitor()
	return nil
}

// onEvent runs on the library's goroutine for every event and must not
// block: it folds the event into sticky state and pokes the monitor. It
// must not touch s.conn, which may not be set yet.
func (s *Session) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	s.evMu.Lock()
	s.zkState = ev.State
	switch ev.State {
	case zk.StateExpired:
		s.expired = true
	case zk.StateDisconnected:
		s.drops++
	}
	s.evMu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Identity is Config.Identity: the x509 subject DN the session's
// certificate proves, or "".
func (s *Session) Identity() string { return s.cfg.Identity }

// SessionTimeout is the negotiated session timeout, or the requested one
// before the first connect.
func (s *Session) SessionTimeout() time.Duration {
	if d := s.negotiated.Load(); d > 0 {
		return time.Duration(d)
	}
	return s.cfg.SessionTimeout
}

// Server is the server the connection is on, or being tried.
func (s *Session) Server() string { return s.conn.Server() }

// Chroot is the chroot from the connect string ("" if none).
func (s *Session) Chroot() string { return s.cs.Chroot }

// ACL is the ACL this session uses for the nodes it creates.
func (s *Session) ACL() []zk.ACL { return s.cfg.ACL }

// Value returns what SetValue stored under key on this Session, for
// layers above that read something once per process (a cluster's ACL
// rule) rather than on every call.
func (s *Session) Value(key any) (any, bool) { return s.values.Load(key) }

// SetValue stores v under key for Value.
func (s *Session) SetValue(key, v any) { s.values.Store(key, v) }

// DeleteValue forgets what is stored under key.
func (s *Session) DeleteValue(key any) { s.values.Delete(key) }

// Requests reports how many requests of each kind this session has sent
// to ZooKeeper so far, by operation name ("get", "children", "exists",
// "watch" for a read that arms a watch, "set", "multi", ...). Heartbeats
// count as "exists". It is there so that tests and benchmarks can count
// round trips (how many reads a way of following records costs).
func (s *Session) Requests() map[string]int64 {
	out := map[string]int64{}
	s.requests.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

// count records one request of kind op for Requests.
func (s *Session) count(op string) {
	n, ok := s.requests.Load(op)
	if !ok {
		n, _ = s.requests.LoadOrStore(op, new(atomic.Int64))
	}
	n.(*atomic.Int64).Add(1)
}

// SessionID is the current ZooKeeper session id (0 when none).
func (s *Session) SessionID() int64 { return s.conn.SessionID() }

// State is the current state.
func (s *Session) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// ConnectedFor is how long the session has been connected without a break
// (0 when it is not connected). A supervisor's peers read it to tell a
// disruption they shared (an election: everyone reconnected just now)
// from a host cut off alone (supervisor/failstatic.go).
func (s *Session) ConnectedFor() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateConnected {
		return 0
	}
	return time.Since(s.stateSince)
}

// SinceOK is how long ago a server last answered a call of this session
// (a heartbeat at least every sixth of the session timeout while
// connected).
func (s *Session) SinceOK() time.Duration {
	return time.Since(time.Unix(0, s.lastOK.Load()))
}

// TimeInState reports the total time spent in each state so far.
func (s *Session) TimeInState() map[State]time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[State]time.Duration{}
	for st, d := range s.timeIn {
		out[State(st)] = d
	}
	out[s.state] += time.Since(s.stateSince)
	return out
}

// WaitConnected blocks until the session is Connected or ctx is done.
func (s *Session) WaitConnected(ctx context.Context) error {
	sub := s.Subscribe()
	defer sub.Close()
	for {
		switch s.State() {
		case StateConnected:
			return nil
		case StateClosed:
			return ErrClosed
		}
		select {
		case <-sub.C:
		case <-ctx.Done():
			return fmt.Errorf("waiting for a zookeeper session at %s (state %s): %w", s.cs, s.State(), ctx.Err())
		}
	}
}

// Close ends the session: ephemeral nodes go away at once, watches stop,
// subscribers get a final change to Closed.
func (s *Session) Close() {
	select {
	case <-s.closed:
		return
	default:
	}
	close(s.closed)
	<-s.done
	s.resyncWG.Wait()
	s.conn.Close()
	s.setState(StateClosed, "closed", 0, false)
	s.mu.Lock()
	for sub := range s.subs {
		close(sub.c)
	}
	s.subs = map[*Subscription]struct{}{}
	s.mu.Unlock()
}

// Subscription delivers state changes. If the reader falls more than the
// buffer behind, the oldest undelivered changes are dropped, so the latest
// state always arrives.
type Subscription struct {
	C <-chan StateChange
	c chan StateChange
	s *Session
}

// Subscribe returns a subscription to state changes. Close it when done.
func (s *Session) Subscribe() *Subscription {
	c := make(chan StateChange, 32)
	sub := &Subscription{C: c, c: c, s: s}
	s.mu.Lock()
	if s.state == StateClosed {
		close(c)
	} else {
		s.subs[sub] = struct{}{}
	}
	s.mu.Unlock()
	return sub
}

// Close stops the subscription.
func (sub *Subscription) Close() {
	sub.s.mu.Lock()
	defer sub.s.mu.Unlock()
	if _, ok := sub.s.subs[sub]; ok {
		delete(sub.s.subs, sub)
		close(sub.c)
	}
}

func (s *Session) setState(to State, reason string, sid int64, newSession bool) {
	s.mu.Lock()
	from := s.state
	if from == to || from == StateClosed {
		s.mu.Unlock()
		return
	}
	now := time.Now()
	s.timeIn[from] += now.Sub(s.stateSince)
	s.state, s.stateSince = to, now
	ch := StateChange{From: from, To: to, At: now, SessionID: sid, NewSession: newSession, Reason: reason}
	for sub := range s.subs {
		select {
		case sub.c <- ch:
		default:
			select { // drop the oldest so the newest gets in
			case <-sub.c:
			default:
			}
			select {
			case sub.c <- ch:
			default:
			}
		}
	}
	s.mu.Unlock()
	lvl := s.log.Info
	if to == StateLost {
		lvl = s.log.Warn
	}
	// The negotiated timeout (the server clamps the asked one to its
	// limits) sets every bound the supervisor states, so it is logged.
	lvl("zookeeper session state", zap.Stringer("from", from), zap.Stringer("to", to),
		zap.String("reason", reason), zap.String("session", fmt.Sprintf("0x%x", sid)), zap.Bool("new_session", newSession),
		zap.Duration("session_timeout", s.SessionTimeout()), zap.Duration("asked_session_timeout", s.cfg.SessionTimeout))
}

// markOK records that a server answered a call.
func (s *Session) markOK() { s.lastOK.Store(time.Now().UnixNano()) }

// monitor drives the state machine: it wakes on library events and on a
// heartbeat tick, and is the only writer of state (besides Close).
func (s *Session) monitor() {
	defer close(s.done)
	var (
		hbBusy    bool
		hbDone    = make(chan struct{}, 1)
		enteredAt = time.Now() // when the current non-connected state began
		seenDrops uint64
		// connectedTo is the server of the last session seen: once the
		// connection drops, conn.Server() already names the next server
		// being tried, and "disconnected from" must name the lost one.
		connectedTo string
	)
	tick := time.NewTicker(s.heartbeatInterval())
	defer tick.Stop()
	wake := s.heartbeatInterval()
	// planned is when the monitor meant to look again; resumed, when it
	// last found itself woken far later than that: this process was
	// paused (SIGSTOP, a frozen VM or cgroup, CPU starvation), not the
	// server silent, so silence counts from then (reviewed in issue 24).
	planned, resumed := time.Now().Add(wake), time.Time{}
	for {
		// A heartbeat starts on the tick, or on a library event (a
		// reconnect is confirmed at once), never because the last one
		// answered: that would ask the server back to back, thousands of
		// times a second per process.
		beat := false
		select {
		case <-s.closed:
			return
		case <-s.kick:
			beat = true
		case <-tick.C:
			beat = true
		case <-hbDone:
			hbBusy = false
		}
		if now := time.Now(); now.Sub(planned) > s.SessionTimeout()/6 {
			resumed = now
		}

		s.evMu.Lock()
		zkState, expired, drops := s.zkState, s.expired, s.drops
		s.expired = false
		dropped := drops != seenDrops
		seenDrops = drops
		// Read here, not in onEvent: the library may deliver its first
		// events before Connect has returned the connection to us.
		zkSession := s.conn.SessionID()
		s.evMu.Unlock()

		timeout := s.SessionTimeout()
		if zkState == zk.StateHasSession && !dropped {
			connectedTo = s.conn.Server()
		}
		lastOK := time.Unix(0, s.lastOK.Load())
		sinceOK := time.Since(lastOK)
		hasSession := zkState == zk.StateHasSession
		cur := s.State()

		// Ask the server something cheap whenever we hold a session; only
		// one heartbeat is ever in flight, so a hung connection cannot pile
		// them up.
		if hasSession && !hbBusy && beat {
			hbBusy = true
			go func() {
				s.heartbeat()
				hbDone <- struct{}{}
			}()
		}

		// A server that answers nothing for a third of the session timeout
		// is given up on: the session moves to another one (it keeps its
		// id, ephemerals and watches) well before the two thirds after
		// which it would count as lost. wake is when to look again.
		wake = s.heartbeatInterval()
		if hasSession && !dropped {
			from := lastOK
			if resumed.After(from) {
				from = resumed
			}
			wake = min(wake, s.checkFrozen(from, timeout))
		}

		switch {
		case expired:
			if cur != StateLost {
				enteredAt = time.Now()
			}
			s.setState(StateLost, "session expired", zkSession, false)
		case cur == StateConnected:
			if sinceOK > timeout*2/3 {
				enteredAt = time.Now()
				s.setState(StateLost, fmt.Sprintf("no successful call for %s (2/3 of session timeout %s)", sinceOK.Round(time.Millisecond), timeout), zkSession, false)
			} else if !hasSession || dropped {
				enteredAt = time.Now()
				from := connectedTo
				if from == "" {
					from = "the server"
				}
				s.setState(StateSuspended, "disconnected from "+from, zkSession, false)
			} else if sinceOK > timeout/3 {
				enteredAt = time.Now()
				s.setState(StateSuspended, fmt.Sprintf("no successful call for %s", sinceOK.Round(time.Millisecond)), zkSession, false)
			}
		case cur == StateSuspended && sinceOK > timeout*2/3:
			enteredAt = time.Now()
			s.setState(StateLost, fmt.Sprintf("no successful call for %s (2/3 of session timeout %s)", sinceOK.Round(time.Millisecond), timeout), zkSession, false)
		case (cur == StateSuspended || cur == StateLost) && hasSession && lastOK.After(enteredAt):
			// A call succeeded after we left Connected: back in business.
			s.mu.Lock()
			newSession := s.connectedID != zkSession
			s.connectedID = zkSession
			s.mu.Unlock()
			reason := "reconnected"
			if newSession {
				reason = "new session"
			}
			s.setState(StateConnected, reason, zkSession, newSession)
			s.resync()
		}
		tick.Reset(wake)
		planned = time.Now().Add(wake)
	}
}

// checkFrozen closes the connection to a server that has answered nothing
// (no call, no heartbeat) for a third of the session timeout since the
// later of the last answer and this connection's handshake. A SIGSTOPped
// server keeps its TCP connections open and answers nothing: the library
// would wait 2/3 of the session timeout for it (its read deadline), the
// moment this session counts as lost. Closing the connection makes the
// library reconnect, with the same session, to the next server, and the
// server is skipped for a session timeout. It returns how long until the
// check could fire.
func (s *Session) checkFrozen(lastOK time.Time, timeout time.Duration) time.Duration {
	c := s.cur.Load()
	if c == nil || !c.hsDone.Load() || c.abandoned.Load() {
		return timeout / 3
	}
	ref := lastOK
	if at := time.Unix(0, c.hsAt.Load()); at.After(ref) {
		ref = at
	}
	silent := time.Since(ref)
	if silent <= timeout/3 {
		return max(time.Millisecond, timeout/3-silent+time.Millisecond)
	}
	c.abandoned.Store(true)
	s.hosts.Avoid(c.addr, timeout)
	s.frozen.Add(1)
	s.log.Warn("zookeeper server stopped answering; moving the session to another server",
		zap.String("server", c.addr), zap.Duration("silent_for", silent.Round(time.Millisecond)),
		zap.Duration("session_timeout", timeout), zap.String("session", fmt.Sprintf("0x%x", s.conn.SessionID())))
	_ = c.Close()
	return timeout / 3
}

// handshakeBound is how long a new connection may take to answer the
// connect request: a sixth of the session timeout (at least 250 ms), so
// that a server that stopped answering costs the reconnect at most that
// before the library tries the next one.
func (s *Session) handshakeBound() time.Duration {
	return max(250*time.Millisecond, s.SessionTimeout()/6)
}

// handshakeFailed: a server accepted the connection but did not answer the
// connect request in time; it is skipped for a session timeout.
func (s *Session) handshakeFailed(addr string) {
	s.hosts.Avoid(addr, s.SessionTimeout())
	s.frozen.Add(1)
	s.log.Warn("zookeeper server accepted the connection but did not answer the handshake; trying another server",
		zap.String("server", addr), zap.Duration("bound", s.handshakeBound()))
}

// ServersAbandoned counts the connections this session gave up on because
// the server stopped answering (a call or a handshake), for tests and
// metrics.
func (s *Session) ServersAbandoned() int64 { return s.frozen.Load() }

func (s *Session) heartbeatInterval() time.Duration {
	d := s.SessionTimeout() / 6
	if d < 50*time.Millisecond {
		d = 50 * time.Millisecond
	}
	return d
}

// heartbeat is one cheap round trip. Its answer, and any other call's,
// moves lastOK.
func (s *Session) heartbeat() {
	ctx, cancel := context.WithTimeout(context.Background(), s.SessionTimeout()/3)
	defer cancel()
	_, _, _ = s.Exists(ctx, "/")
}

// resync re-creates ephemeral nodes and tells every watch to re-read.
// It runs on each return to Connected, in the background so that the
// monitor keeps running.
func (s *Session) resync() {
	s.mu.Lock()
	eph := make([]*Ephemeral, 0, len(s.ephemerals))
	for _, e := range s.ephemerals {
		eph = append(eph, e)
	}
	for ch := range s.resyncs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	s.mu.Unlock()
	if len(eph) == 0 {
		return
	}
	s.resyncWG.Add(1)
	go func() {
		defer s.resyncWG.Done()
		for _, e := range eph {
			e.ensure()
		}
	}()
}
