// Package bucketmap is the source of truth for "which db node owns which
// user": the bucket map (level, owner and state of every bucket, previous
// owners) and the db node registry, their record format, splits, and the
// deterministic planner that rebalances when nodes join, drain or die.
//
// A Map is immutable once built: readers (the router) share one without
// locks, and every change is made on a Clone and written back by
// compare-and-swap (Store.Update).
package bucketmap

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

// MaxLevel is the deepest level a map may have. 2^17 buckets encode to
// about 350 KB of owners, leaving room under ZooKeeper's 1 MiB for the node
// registry and history.
const MaxLevel = 17

// MaxDepth is the deepest a single-bucket split goes (SplitBucket). A map
// of mixed depths stores one owner per bucket, not per slot, so its record
// stays small however deep one bucket is; what grows is each reader's
// directory of 2^Level slots, 3 MiB at depth 20.
const MaxDepth = 20

// MaxNodes bounds the registry (owners are 16-bit indexes).
const MaxNodes = 1 << 16

// MaxWeight bounds a node's relative capacity.
const MaxWeight = 10000

// NodeID names a db node.
type NodeID string

// NodeState is a db node's lifecycle state.
type NodeState string

const (
	// NodeActive nodes own buckets and receive them when balancing.
	NodeActive NodeState = "active"
	// NodeDraining nodes keep serving their buckets but the planner moves
	// all of them away.
	NodeDraining NodeState = "draining"
	// NodeDown nodes are unreachable; their buckets are reassigned at once
	// without copying.
	NodeDown NodeState = "down"
	// NodeRemoved nodes own nothing and stay in the registry only while the
	// history still mentions them.
	NodeRemoved NodeState = "removed"
)

func (s NodeState) valid() bool {
	return s == NodeActive || s == NodeDraining || s == NodeDown || s == NodeRemoved
}

// Node is one db node in the registry.
type Node struct {
	ID NodeID
	// DSN is a postgres:// URL without a password: the direct path, for
	// everything that needs a session or replication (moves, GC, fence
	// sync, schema changes, sizing, node check, subscriptions).
	DSN string
	// PoolDSN, when set, is the application path: the same database
	// through a pooler in transaction mode (PgBouncer), in the same form
	// as DSN, logging in with the same password reference. Routers and
	// the Python package connect there; "" means DSN serves both.
	PoolDSN string
	// Password says where the password comes from: "env:NAME",
	// "file:/path", or "" (none, or from the environment's pgpass).
	Password string
	// StreamUser, when set, is the role the moves' streams (logical
	// subscriptions to this node: a catch-up stream from it, a reverse
	// stream to it) log in as, by the subscribing server's client
	// certificate (pg_hba "cert"): no password goes into the subscriber's
	// catalog. "": the DSN's user with the node's password, as before.
	StreamUser string
	Weight     int
	State      NodeState
	// Patroni names the node's Patroni group, when the node is one: the
	// DSN then reaches the group's primary (a multi-host DSN with
	// target_session_attrs=read-write), and the group's members, leader
	// and sync state are read from Patroni's records in ZooKeeper
	// (package patroni).
	Patroni Patroni
}

// AppDSN is where applications connect: the pooler if the node has one,
// else the DSN.
func (n Node) AppDSN() string {
	if n.PoolDSN != "" {
		return n.PoolDSN
	}
	return n.DSN
}

// Pooled reports whether applications reach the node through a pooler.
func (n Node) Pooled() bool { return n.PoolDSN != "" }

// Patroni names a Patroni group: its records live under
// Namespace + Scope + "/" on the cluster's ZooKeeper ensemble. The zero
// value means the node is a plain PostgreSQL server.
type Patroni struct {
	Namespace string `json:"namespace"` // "/service/" by default, as Patroni's
	Scope     string `json:"scope"`
}

// IsZero reports whether p names no group.
func (p Patroni) IsZero() bool { return p == Patroni{} }

// DefaultPatroniNamespace is Patroni's own default namespace.
const DefaultPatroniNamespace = "/service/"

var patroniScopeRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Validate checks a group reference: a namespace that is an absolute
// ZooKeeper path ending in "/" and a scope that is one path component.
func (p Patroni) Validate() error {
	if p.IsZero() {
		return nil
	}
	if !patroniScopeRE.MatchString(p.Scope) {
		return fmt.Errorf("patroni scope %q must be 1-63 characters of letters, digits, '.', '_' or '-'", p.Scope)
	}
	ns := p.Namespace
	if !strings.HasPrefix(ns, "/") || !strings.HasSuffix(ns, "/") || strings.Contains(ns, "//") || strings.Contains(ns, "/./") || strings.Contains(ns, "/../") {
		return fmt.Errorf("patroni namespace %q must be an absolute ZooKeeper path ending in '/' (Patroni's default is %s)", ns, DefaultPatroniNamespace)
	}
	return nil
}

// BucketState is the state of one bucket.
type BucketState string

const (
	// BucketActive buckets are served by their owner.
	BucketActive BucketState = "active"
	// BucketMoving buckets are in the write pause of a move to Target:
	// writes wait, reads may still go to the owner.
	BucketMoving BucketState = "moving"
)

// BucketMeta is what a bucket has beyond its owner. The zero value is a
// plainly active bucket.
type BucketMeta struct {
	State  BucketState
	Target NodeID // moving: where to
	Move   string // moving: the move record id
	Since  uint64 // map version at which State began
	// DataLost marks a bucket whose ownership changed without copying its
	// rows (its node died, or an operator reassigned it with --no-copy).
	DataLost bool
}

func (b BucketMeta) plain() bool {
	return (b.State == "" || b.State == BucketActive) && !b.DataLost
}

// Handoff records that Node owned buckets Lo..Hi until map version
// UntilVersion, at time At.
type Handoff struct {
	Lo, Hi       uint32
	Node         NodeID
	UntilVersion uint64
	At           time.Time
}

// Map is one version of the bucket map and node registry.
type Map struct {
	Version   uint64
	Level     int
	UpdatedAt time.Time
	// Encoding is how the record is stored in ZooKeeper, not part of the
	// map's content: Decode sets it from the record read, Clone keeps it
	// and Encode writes it, so every writer keeps the form the cluster
	// was switched to (Store.SetEncoding). "" is plain.
	Encoding MapEncoding

	nodes []Node // registry in insertion order; owners index into it
	index map[NodeID]int
	// owners is the directory: one entry per slot, 2^Level of them. A
	// bucket shallower than Level covers a run of slots that all name
	// its owner, so that a lookup is one index whatever the depths.
	owners []uint16
	// depth is the depth of the bucket covering each slot, nil when every
	// bucket is at Level (then a slot is a bucket).
	depth    []uint8
	nbuckets int
	// meta is keyed by a bucket's first slot.
	meta    map[uint32]BucketMeta
	history []Handoff
}

// Buckets is the number of buckets: 2^Level at one depth, fewer when
// some are shallower (Slots is the directory's size).
func (m *Map) Buckets() int {
	if m.depth == nil {
		return 1 << m.Level
	}
	return m.nbuckets
}

// Owner returns the node that owns directory slot s (< Slots()): on a map
// at one depth, bucket s.
func (m *Map) Owner(s uint32) NodeID { return m.nodes[m.owners[s]].ID }

// OwnerIndex returns the registry index of slot s's owner: with Nodes()
// it lets hot paths avoid string work.
func (m *Map) OwnerIndex(s uint32) int { return int(m.owners[s]) }

// OwnerIndexes returns every slot's owner as an index into Nodes(): the
// router's hot path reads it directly. Do not modify it.
func (m *Map) OwnerIndexes() []uint16 { return m.owners }

// Meta returns the state beyond its owner of the bucket covering slot s.
func (m *Map) Meta(s uint32) BucketMeta {
	if m.depth != nil {
		s, _ = m.SlotsOf(m.BucketAt(s))
	}
	if bm, ok := m.meta[s]; ok {
		if bm.State == "" {
			bm.State = BucketActive
		}
		return bm
	}
	return BucketMeta{State: BucketActive}
}

// Nodes returns the registry in its stored order. Do not modify it.
func (m *Map) Nodes() []Node { return m.nodes }

// LiveNodes returns the registry's nodes that are neither marked down nor
// removed (a removed node stays in the registry while the history names
// it), in registry order: the nodes every schema change must reach.
func (m *Map) LiveNodes() []Node {
	var out []Node
	for _, n := range m.nodes {
		if n.State != NodeDown && n.State != NodeRemoved {
			out = append(out, n)
		}
	}
	return out
}

// Node returns a node by id.
func (m *Map) Node(id NodeID) (Node, bool) {
	i, ok := m.index[id]
	if !ok {
		return Node{}, false
	}
	return m.nodes[i], true
}

// History returns the handoffs still recorded, oldest first.
func (m *Map) History() []Handoff { return m.history }

// HistoryOf returns the handoffs that cover slot s (history ranges are in
// slots: on a map at one depth, buckets).
func (m *Map) HistoryOf(s uint32) []Handoff {
	var out []Handoff
	for _, h := range m.history {
		if h.Lo <= s && s <= h.Hi {
			out = append(out, h)
		}
	}
	return out
}

// NonActive returns the buckets whose state is not plain active, in key
// order.
func (m *Map) NonActive() []Bucket {
	keys := make([]uint32, 0, len(m.meta))
	for s := range m.meta {
		keys = append(keys, s)
	}
	slices.Sort(keys)
	out := make([]Bucket, len(keys))
	for i, s := range keys {
		out[i] = m.BucketAt(s)
	}
	return out
}

// Counts returns how many buckets each node owns.
func (m *Map) Counts() map[NodeID]int {
	c := make([]int, len(m.nodes))
	if m.depth == nil {
		for _, o := range m.owners {
			c[o]++
		}
	} else {
		m.EachBucket(func(_ Bucket, lo, _ uint32) bool {
			c[m.owners[lo]]++
			return true
		})
	}
	out := make(map[NodeID]int, len(m.nodes))
	for i, n := range m.nodes {
		out[n.ID] = c[i]
	}
	return out
}

// BucketOf returns the bucket of a user id.
func (m *Map) BucketOf(ks *keystream.Keystream, uid string) Bucket {
	return m.BucketOfPrefix(ks.Prefix64(uid))
}

// Clone returns a deep copy to edit.
func (m *Map) Clone() *Map {
	c := &Map{Version: m.Version, Level: m.Level, UpdatedAt: m.UpdatedAt, Encoding: m.Encoding}
	c.nodes = append([]Node(nil), m.nodes...)
	c.index = make(map[NodeID]int, len(m.index))
	for k, v := range m.index {
		c.index[k] = v
	}
	c.owners = append([]uint16(nil), m.owners...)
	if m.depth != nil {
		c.depth = append([]uint8(nil), m.depth...)
	}
	c.nbuckets = m.nbuckets
	c.meta = make(map[uint32]BucketMeta, len(m.meta))
	for k, v := range m.meta {
		c.meta[k] = v
	}
	c.history = append([]Handoff(nil), m.history...)
	return c
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateNode checks a node's fields on their own.
func ValidateNode(n Node) error {
	if err := topo.ValidName("node", string(n.ID)); err != nil {
		return err
	}
	if err := ValidateDSN(n.DSN); err != nil {
		return fmt.Errorf("node %s: %w", n.ID, err)
	}
	if n.PoolDSN != "" {
		if err := ValidateDSN(n.PoolDSN); err != nil {
			return fmt.Errorf("node %s: pool %w", n.ID, err)
		}
		// The application's traffic goes the pooler's way: it must not
		// verify the server less than the direct path does.
		if d, p := sslRank(n.DSN), sslRank(n.PoolDSN); p < d {
			return fmt.Errorf("node %s: the pool dsn %q verifies its server less than the dsn does (sslmode %s against %s): give it the dsn's sslmode and sslrootcert",
				n.ID, redactDSN(n.PoolDSN), sslModeOf(n.PoolDSN), sslModeOf(n.DSN))
		}
	}
	if err := ValidatePasswordRef(n.Password); err != nil {
		return fmt.Errorf("node %s: %w", n.ID, err)
	}
	if err := n.Patroni.Validate(); err != nil {
		return fmt.Errorf("node %s: %w", n.ID, err)
	}
	if err := validateStreamUser(n); err != nil {
		return fmt.Errorf("node %s: %w", n.ID, err)
	}
	if !n.Patroni.IsZero() {
		// Even a group of one listed host: after a failover a client
		// without the attribute would keep writing to a standby. The
		// pooler path too: each member's pooler is in front of that
		// member, so the attribute picks the primary's.
		for _, d := range []struct{ name, dsn string }{{"dsn", n.DSN}, {"pool dsn", n.PoolDSN}} {
			if d.dsn == "" {
				continue
			}
			if u, err := url.Parse(d.dsn); err == nil {
				if a := u.Query().Get("target_session_attrs"); a != "read-write" && a != "primary" {
					return fmt.Errorf("node %s is a Patroni group: its %s %q must set target_session_attrs=read-write (and list every member)", n.ID, d.name, redactDSN(d.dsn))
				}
			}
		}
	}
	if n.Weight < 1 || n.Weight > MaxWeight {
		return fmt.Errorf("node %s: weight %d out of range 1..%d", n.ID, n.Weight, MaxWeight)
	}
	if !n.State.valid() {
		return fmt.Errorf("node %s: state %q is not one of active, draining, down, removed", n.ID, n.State)
	}
	return nil
}

// sslModeOf is a DSN's sslmode, libpq's default ("prefer") when it sets
// none.
func sslModeOf(dsn string) string {
	if u, err := url.Parse(dsn); err == nil {
		if m := u.Query().Get("sslmode"); m != "" {
			return m
		}
	}
	return "prefer"
}

// sslRank orders sslmodes by what they guarantee about the server.
func sslRank(dsn string) int {
	return map[string]int{"disable": 0, "allow": 1, "prefer": 2, "require": 3, "verify-ca": 4, "verify-full": 5}[sslModeOf(dsn)]
}

var roleRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// validateStreamUser: a role name as PostgreSQL folds it, and a DSN that
// verifies the server, since the certificate is only sent over TLS and a
// stream that does not verify the server would hand its rows to whoever
// answers.
func validateStreamUser(n Node) error {
	if n.StreamUser == "" {
		return nil
	}
	if !roleRE.MatchString(n.StreamUser) {
		return fmt.Errorf("stream user %q must be a role name: lower-case letters, digits and '_', at most 63", n.StreamUser)
	}
	if u, err := url.Parse(n.DSN); err == nil {
		if m := u.Query().Get("sslmode"); m != "verify-full" && m != "verify-ca" {
			return fmt.Errorf("stream user %s logs in by client certificate: the dsn %q must set sslmode=verify-full (or verify-ca) and sslrootcert", n.StreamUser, redactDSN(n.DSN))
		}
	}
	return nil
}

// ValidateDSN accepts a postgres:// or postgresql:// URL with a host and no
// password: passwords live outside ZooKeeper (see ValidatePasswordRef).
func ValidateDSN(dsn string) error {
	u, err := url.Parse(dsn)
	if err != nil {
		return fmt.Errorf("dsn is not a URL: %v", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return fmt.Errorf("dsn %q must be a postgres:// URL", redactDSN(dsn))
	}
	if u.Host == "" {
		return fmt.Errorf("dsn %q has no host", redactDSN(dsn))
	}
	if _, has := u.User.Password(); has {
		return fmt.Errorf("dsn %q contains a password; store a reference instead (--password env:NAME or file:/path)", redactDSN(dsn))
	}
	if u.Query().Has("password") {
		return fmt.Errorf("dsn %q has a password parameter; store a reference instead (--password env:NAME or file:/path)", redactDSN(dsn))
	}
	// libpq and pgx also take hosts from query parameters, which the
	// host checks below (and DSNHosts) would not see.
	for _, k := range []string{"host", "hostaddr", "port"} {
		if u.Query().Has(k) {
			return fmt.Errorf("dsn %q has a %s parameter; list hosts and ports in the URL's authority: postgres://user@h1:p1,h2:p2/db", redactDSN(dsn), k)
		}
	}
	hosts := DSNHosts(dsn)
	for _, h := range hosts {
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			if strings.Contains(err.Error(), "missing port") {
				host, port = h, "5432"
			} else {
				return fmt.Errorf("dsn %q: host %q: %v", redactDSN(dsn), h, err)
			}
		}
		if host == "" {
			return fmt.Errorf("dsn %q: an empty host in the host list", redactDSN(dsn))
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("dsn %q: host %q: port %q is not 1..65535", redactDSN(dsn), h, port)
		}
	}
	// Every client of a multi-host DSN must land on the group's primary:
	// without the attribute libpq and pgx take the first host that
	// answers, a standby that refuses every write.
	if len(hosts) > 1 {
		switch a := u.Query().Get("target_session_attrs"); a {
		case "read-write", "primary":
		default:
			return fmt.Errorf("dsn %q lists %d hosts but target_session_attrs is %q: add target_session_attrs=read-write so that every client reaches the primary", redactDSN(dsn), len(hosts), a)
		}
	}
	return nil
}

// DSNHosts lists the host:port entries of a postgres:// URL, which libpq
// and pgx allow to be a comma-separated list (a multi-host DSN: the
// client tries them in order). A host without a port is returned alone.
func DSNHosts(dsn string) []string {
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		return nil
	}
	var out []string
	for _, h := range strings.Split(u.Host, ",") {
		out = append(out, h)
	}
	return out
}

// redactDSN hides any password in a DSN so that error messages can show it.
func redactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "<unparseable dsn>"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "REDACTED")
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "REDACTED")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// ValidatePasswordRef accepts "", "env:NAME" and "file:/absolute/path".
func ValidatePasswordRef(ref string) error {
	switch {
	case ref == "":
		return nil
	case strings.HasPrefix(ref, "env:"):
		if !envNameRE.MatchString(ref[4:]) {
			return fmt.Errorf("password reference %q: %q is not an environment variable name", ref, ref[4:])
		}
		return nil
	case strings.HasPrefix(ref, "file:"):
		if !strings.HasPrefix(ref[5:], "/") {
			return fmt.Errorf("password reference %q: the file path must be absolute", ref)
		}
		return nil
	}
	// Not echoed: it may be the password itself, pasted by mistake.
	return fmt.Errorf("password reference must be env:NAME or file:/path (never the password itself)")
}

// Validate checks the whole map for consistency. Decode calls it, and
// Store.Update calls it before every write, so an edit can never store an
// inconsistent map.
func (m *Map) Validate() error {
	if m.Version < 1 {
		return fmt.Errorf("map version %d: must be at least 1", m.Version)
	}
	if m.Level < 0 || m.Level > MaxDepth || (m.depth == nil && m.Level > MaxLevel) {
		return fmt.Errorf("level %d out of range 0..%d (0..%d at mixed depths)", m.Level, MaxLevel, MaxDepth)
	}
	if len(m.nodes) == 0 {
		return fmt.Errorf("no db nodes in the registry")
	}
	if len(m.nodes) > MaxNodes {
		return fmt.Errorf("%d db nodes, more than %d", len(m.nodes), MaxNodes)
	}
	for i, n := range m.nodes {
		if err := ValidateNode(n); err != nil {
			return err
		}
		if j, ok := m.index[n.ID]; !ok || j != i {
			return fmt.Errorf("node %s is listed twice", n.ID)
		}
	}
	if len(m.index) != len(m.nodes) {
		return fmt.Errorf("node index out of step with the registry")
	}
	if len(m.owners) != m.Slots() {
		return fmt.Errorf("%d owners for %d slots (level %d)", len(m.owners), m.Slots(), m.Level)
	}
	if err := m.validateDepths(); err != nil {
		return err
	}
	for b, o := range m.owners {
		if int(o) >= len(m.nodes) {
			return fmt.Errorf("bucket %s: owner index %d is not in the registry (%d nodes)", m.Name(m.BucketAt(uint32(b))), o, len(m.nodes))
		}
		if m.nodes[o].State == NodeRemoved {
			return fmt.Errorf("bucket %s is owned by removed node %s", m.Name(m.BucketAt(uint32(b))), m.nodes[o].ID)
		}
	}
	for s, bm := range m.meta {
		if int64(s) >= int64(m.Slots()) {
			return fmt.Errorf("bucket %d has state but the map has only %d buckets", s, m.Slots())
		}
		bk := m.BucketAt(s)
		if lo, _ := m.SlotsOf(bk); lo != s {
			return fmt.Errorf("state recorded at slot %d, inside bucket %s, not at its start", s, bk)
		}
		b := m.Name(bk)
		switch bm.State {
		case "", BucketActive:
			if bm.Target != "" || bm.Move != "" {
				return fmt.Errorf("bucket %s is active but names a move target or id", b)
			}
			if !bm.DataLost {
				return fmt.Errorf("bucket %s: plain active buckets are not listed", b)
			}
		case BucketMoving:
			t, ok := m.index[bm.Target]
			if !ok {
				return fmt.Errorf("bucket %s is moving to unknown node %q", b, bm.Target)
			}
			if int(m.owners[s]) == t {
				return fmt.Errorf("bucket %s is moving to its own owner %s", b, bm.Target)
			}
			if m.nodes[t].State == NodeRemoved {
				return fmt.Errorf("bucket %s is moving to removed node %s", b, bm.Target)
			}
			if bm.Move == "" {
				return fmt.Errorf("bucket %s is moving but names no move id", b)
			}
		default:
			return fmt.Errorf("bucket %s: state %q is not active or moving", b, bm.State)
		}
		if bm.Since > m.Version {
			return fmt.Errorf("bucket %s: state since map version %d, after the map's version %d", b, bm.Since, m.Version)
		}
	}
	for i, h := range m.history {
		if h.Lo > h.Hi || int64(h.Hi) >= int64(m.Slots()) {
			return fmt.Errorf("history entry %d: bucket range %d..%d outside 0..%d", i, h.Lo, h.Hi, m.Slots()-1)
		}
		if _, ok := m.index[h.Node]; !ok {
			return fmt.Errorf("history entry %d names unknown node %q", i, h.Node)
		}
		if h.UntilVersion > m.Version || h.UntilVersion == 0 {
			return fmt.Errorf("history entry %d: until map version %d, but the map is at version %d", i, h.UntilVersion, m.Version)
		}
	}
	return nil
}
