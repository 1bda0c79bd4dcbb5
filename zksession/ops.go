package zksession

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/go-zookeeper/zk"
)

// MaxDataSize is the largest payload this package will write to one znode.
// ZooKeeper's jute.maxbuffer (1 MiB by default) bounds a whole request
// packet, so keep a little room for the path and headers. Refusing here gives
// a clear error instead of the server dropping the connection.
const MaxDataSize = 1<<20 - 1024

// Errors callers test with errors.Is. Library errors are mapped to these so
// that no other package needs to import the zk library.
var (
	ErrNoNode       = errors.New("node does not exist")
	ErrNodeExists   = errors.New("node already exists")
	ErrBadVersion   = errors.New("version conflict: the node changed since it was read")
	ErrNotEmpty     = errors.New("node has children")
	ErrNoAuth       = errors.New("not authorized (check the zookeeper credentials and the node's ACL)")
	ErrTooLarge     = errors.New("data too large for a znode")
	ErrTimeout      = errors.New("zookeeper call timed out")
	ErrNotConnected = errors.New("zookeeper session is not connected; writes are refused until it is")
	ErrClosed       = errors.New("zookeeper session is closed")
	ErrConnection   = errors.New("zookeeper connection lost during the call")
)

// OpError says which call on which path failed.
type OpError struct {
	Op   string
	Path string
	Err  error
}

func (e *OpError) Error() string { return fmt.Sprintf("zookeeper %s %s: %v", e.Op, e.Path, e.Err) }
func (e *OpError) Unwrap() error { return e.Err }

// Stat is the subset of znode metadata callers use.
type Stat struct {
	Version        int32 // data version, for compare-and-swap
	Cversion       int32 // children version
	Czxid, Mzxid   int64
	Pzxid          int64
	Ctime, Mtime   int64 // ms since epoch
	EphemeralOwner int64
	DataLength     int32
	NumChildren    int32
}

func statOf(s *zk.Stat) Stat {
	if s == nil {
		return Stat{}
	}
	return Stat{Version: s.Version, Cversion: s.Cversion, Czxid: s.Czxid, Mzxid: s.Mzxid, Pzxid: s.Pzxid,
		Ctime: s.Ctime, Mtime: s.Mtime, EphemeralOwner: s.EphemeralOwner, DataLength: s.DataLength, NumChildren: s.NumChildren}
}

// AnyVersion skips the version check of Set, Delete and Check.
const AnyVersion = -1

func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, zk.ErrNoNode):
		return ErrNoNode
	case errors.Is(err, zk.ErrNodeExists):
		return ErrNodeExists
	case errors.Is(err, zk.ErrBadVersion):
		return ErrBadVersion
	case errors.Is(err, zk.ErrNotEmpty):
		return ErrNotEmpty
	case errors.Is(err, zk.ErrNoAuth), errors.Is(err, zk.ErrAuthFailed), errors.Is(err, zk.ErrInvalidACL):
		return fmt.Errorf("%w: %v", ErrNoAuth, err)
	case errors.Is(err, zk.ErrClosing):
		return ErrClosed
	case errors.Is(err, zk.ErrConnectionClosed), errors.Is(err, zk.ErrNoServer), errors.Is(err, zk.ErrSessionExpired):
		return fmt.Errorf("%w: %v", ErrConnection, err)
	}
	return err
}

// answered reports whether err came from a server (so the call proves the
// session is alive) rather than from the connection.
func answered(err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, zk.ErrConnectionClosed), errors.Is(err, zk.ErrNoServer),
		errors.Is(err, zk.ErrSessionExpired), errors.Is(err, zk.ErrClosing):
		return false
	}
	return true
}

// abs turns a caller's path into the server path under the chroot.
func (s *Session) abs(p string) (string, error) {
	if err := validatePath(p); err != nil {
		return "", err
	}
	if s.cs.Chroot == "" {
		return p, nil
	}
	if p == "/" {
		return s.cs.Chroot, nil
	}
	return s.cs.Chroot + p, nil
}

type result[T any] struct {
	v   T
	err error
}

// call runs f on the connection with a deadline. The library has none, and a
// call made while disconnected can wait for a reconnect indefinitely: we stop
// waiting, and the goroutine ends when the library answers or gives up.
func call[T any](s *Session, ctx context.Context, op, p string, write bool, f func(c Conn, abs string) (T, error)) (T, error) {
	var zero T
	select {
	case <-s.closed:
		return zero, &OpError{op, p, ErrClosed}
	default:
	}
	ap, err := s.abs(p)
	if err != nil {
		return zero, &OpError{op, p, err}
	}
	if write {
		if st := s.State(); st != StateConnected {
			return zero, &OpError{op, p, fmt.Errorf("%w (state %s)", ErrNotConnected, st)}
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.OpTimeout)
		defer cancel()
	}
	s.count(op)
	ch := make(chan result[T], 1)
	go func() {
		v, err := f(s.conn, ap)
		ch <- result[T]{v, err}
	}()
	select {
	case r := <-ch:
		if answered(r.err) {
			s.markOK()
		}
		if r.err != nil {
			return zero, &OpError{op, p, mapErr(r.err)}
		}
		return r.v, nil
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return zero, &OpError{op, p, fmt.Errorf("%w (state %s)", ErrTimeout, s.State())}
		}
		return zero, &OpError{op, p, ctx.Err()}
	}
}

func checkSize(op, p string, data []byte) error {
	if len(data) > MaxDataSize {
		return &OpError{op, p, fmt.Errorf("%w: %d bytes (%.2f MiB), the limit is %d bytes (ZooKeeper's 1 MiB jute.maxbuffer less room for headers)",
			ErrTooLarge, len(data), float64(len(data))/(1<<20), MaxDataSize)}
	}
	return nil
}

type getResult struct {
	data []byte
	stat *zk.Stat
}

// Get reads a node's data and stat.
func (s *Session) Get(ctx context.Context, p string) ([]byte, Stat, error) {
	r, err := call(s, ctx, "get", p, false, func(c Conn, ap string) (getResult, error) {
		d, st, err := c.Get(ap)
		return getResult{d, st}, err
	})
	return r.data, statOf(r.stat), err
}

// Exists reports whether a node exists, with its stat when it does.
func (s *Session) Exists(ctx context.Context, p string) (bool, Stat, error) {
	r, err := call(s, ctx, "exists", p, false, func(c Conn, ap string) (getResult, error) {
		ok, st, err := c.Exists(ap)
		if !ok {
			st = nil
		}
		return getResult{stat: st}, err
	})
	return r.stat != nil, statOf(r.stat), err
}

// Sync makes the server this session talks to catch up with the leader on
// p, so that a following read sees every write committed before the Sync.
// ZooKeeper gives read-your-writes only within one session; a reader that
// must see another process's write first calls Sync.
func (s *Session) Sync(ctx context.Context, p string) error {
	_, err := call(s, ctx, "sync", p, false, func(c Conn, ap string) (string, error) {
		return c.Sync(ap)
	})
	return err
}

// Children lists a node's children, sorted as the server returns them.
func (s *Session) Children(ctx context.Context, p string) ([]string, Stat, error) {
	type res struct {
		names []string
		stat  *zk.Stat
	}
	r, err := call(s, ctx, "children", p, false, func(c Conn, ap string) (res, error) {
		n, st, err := c.Children(ap)
		return res{n, st}, err
	})
	return r.names, statOf(r.stat), err
}

// Create makes a persistent node with the session's ACL. Its parent must
// exist (see CreateAll).
func (s *Session) Create(ctx context.Context, p string, data []byte) error {
	return s.create(ctx, p, data, 0, s.cfg.ACL)
}

// CreateWithACL makes a persistent node with the given ACL.
func (s *Session) CreateWithACL(ctx context.Context, p string, data []byte, acl []zk.ACL) error {
	return s.create(ctx, p, data, 0, acl)
}

func (s *Session) create(ctx context.Context, p string, data []byte, flags int32, acl []zk.ACL) error {
	if err := checkSize("create", p, data); err != nil {
		return err
	}
	_, err := call(s, ctx, "create", p, true, func(c Conn, ap string) (string, error) {
		return c.Create(ap, data, flags, acl)
	})
	return err
}

// CreateAll makes p and any missing parents (with empty data), like
// mkdir -p. Existing nodes are left as they are.
func (s *Session) CreateAll(ctx context.Context, p string) error {
	if err := validatePath(p); err != nil {
		return &OpError{"create", p, err}
	}
	if p == "/" {
		return nil
	}
	cur := ""
	for _, part := range strings.Split(p[1:], "/") {
		cur += "/" + part
		if err := s.Create(ctx, cur, nil); err != nil && !errors.Is(err, ErrNodeExists) {
			return err
		}
	}
	return nil
}

// Set writes data if the node's version is still version (compare-and-swap;
// AnyVersion skips the check). A lost race returns an error wrapping
// ErrBadVersion.
func (s *Session) Set(ctx context.Context, p string, data []byte, version int32) (Stat, error) {
	if err := checkSize("set", p, data); err != nil {
		return Stat{}, err
	}
	st, err := call(s, ctx, "set", p, true, func(c Conn, ap string) (*zk.Stat, error) {
		return c.Set(ap, data, version)
	})
	return statOf(st), err
}

// Delete removes a node if its version is still version. An ephemeral
// node this session keeps (CreateEphemeral) is no longer kept: this
// session deleting it means it should be gone, where a deletion by
// another session is undone (Ephemeral's guard).
func (s *Session) Delete(ctx context.Context, p string, version int32) error {
	s.forgetEphemeral(p)
	_, err := call(s, ctx, "delete", p, true, func(c Conn, ap string) (struct{}, error) {
		return struct{}{}, c.Delete(ap, version)
	})
	return err
}

// DeleteAll removes p and everything below it. Used for cleanup (tests,
// `shardctl` destroy); not atomic.
func (s *Session) DeleteAll(ctx context.Context, p string) error {
	kids, _, err := s.Children(ctx, p)
	if errors.Is(err, ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, k := range kids {
		if err := s.DeleteAll(ctx, path.Join(p, k)); err != nil {
			return err
		}
	}
	if err := s.Delete(ctx, p, AnyVersion); err != nil && !errors.Is(err, ErrNoNode) {
		return err
	}
	return nil
}

// GetACL reads a node's ACL. ZooKeeper answers only callers that may read
// or administer the node, and hides the password hashes of digest entries
// ("user:x") from callers without the admin permission.
func (s *Session) GetACL(ctx context.Context, p string) ([]zk.ACL, Stat, error) {
	type res struct {
		acl  []zk.ACL
		stat *zk.Stat
	}
	r, err := call(s, ctx, "getacl", p, false, func(c Conn, ap string) (res, error) {
		acl, st, err := c.GetACL(ap)
		return res{acl, st}, err
	})
	return r.acl, statOf(r.stat), err
}

// SetACL replaces a node's ACL if its ACL version (Stat has no field for
// it; AnyVersion skips the check) is still version.
func (s *Session) SetACL(ctx context.Context, p string, acl []zk.ACL, version int32) error {
	if len(acl) == 0 {
		return &OpError{"setacl", p, errors.New("empty ACL: nobody could ever touch the node again")}
	}
	_, err := call(s, ctx, "setacl", p, true, func(c Conn, ap string) (*zk.Stat, error) {
		return c.SetACL(ap, acl, version)
	})
	return err
}

// Op is one operation of a Multi transaction.
type Op struct {
	kind    opKind
	Path    string
	Data    []byte
	Version int32
	ACL     []zk.ACL
	flags   int32
}

type opKind int

const (
	opCheck opKind = iota + 1
	opCreate
	opSet
	opDelete
)

func (o Op) name() string {
	return map[opKind]string{opCheck: "check", opCreate: "create", opSet: "set", opDelete: "delete"}[o.kind]
}

// CheckOp asserts a node's version without changing it.
func CheckOp(p string, version int32) Op { return Op{kind: opCheck, Path: p, Version: version} }

// CreateOp creates a persistent node (nil acl: the session's ACL).
func CreateOp(p string, data []byte, acl []zk.ACL) Op {
	return Op{kind: opCreate, Path: p, Data: data, ACL: acl}
}

// SetOp writes a node if its version is still version.
func SetOp(p string, data []byte, version int32) Op {
	return Op{kind: opSet, Path: p, Data: data, Version: version}
}

// DeleteOp deletes a node if its version is still version.
func DeleteOp(p string, version int32) Op { return Op{kind: opDelete, Path: p, Version: version} }

// Multi applies ops atomically: all or none. On failure the error names the
// first operation that failed (the others report only that they were rolled
// back).
func (s *Session) Multi(ctx context.Context, ops ...Op) ([]Stat, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	total := 0
	reqs := make([]any, len(ops))
	for i, o := range ops {
		ap, err := s.abs(o.Path)
		if err != nil {
			return nil, &OpError{"multi " + o.name(), o.Path, err}
		}
		total += len(o.Data) + len(ap)
		switch o.kind {
		case opCheck:
			reqs[i] = &zk.CheckVersionRequest{Path: ap, Version: o.Version}
		case opCreate:
			acl := o.ACL
			if acl == nil {
				acl = s.cfg.ACL
			}
			reqs[i] = &zk.CreateRequest{Path: ap, Data: o.Data, Acl: acl, Flags: o.flags}
		case opSet:
			reqs[i] = &zk.SetDataRequest{Path: ap, Data: o.Data, Version: o.Version}
		case opDelete:
			reqs[i] = &zk.DeleteRequest{Path: ap, Version: o.Version}
		default:
			return nil, fmt.Errorf("zookeeper multi: operation %d has no kind (build ops with CheckOp, SetOp, ...)", i)
		}
	}
	if total > MaxDataSize {
		return nil, &OpError{"multi", ops[0].Path, fmt.Errorf("%w: the transaction carries %d bytes, the limit is %d", ErrTooLarge, total, MaxDataSize)}
	}
	resp, err := call(s, ctx, "multi", ops[0].Path, true, func(c Conn, _ string) ([]zk.MultiResponse, error) {
		r, err := c.Multi(reqs...)
		if err != nil && r == nil {
			return nil, err
		}
		// The server marks ops before the failing one OK and ops after it
		// rolled back, so the first error is the cause.
		for i, mr := range r {
			if mr.Error != nil {
				return r, &multiOpError{i, mr.Error}
			}
		}
		return r, err
	})
	if err != nil {
		var oe *OpError
		var me *multiOpError
		if errors.As(err, &oe) && errors.As(oe.Err, &me) {
			o := ops[me.index]
			return nil, &OpError{"multi " + o.name(), o.Path, mapErr(me.err)}
		}
		return nil, err
	}
	out := make([]Stat, len(resp))
	for i, r := range resp {
		out[i] = statOf(r.Stat)
	}
	return out, nil
}

type multiOpError struct {
	index int
	err   error
}

func (e *multiOpError) Error() string { return fmt.Sprintf("operation %d: %v", e.index, e.err) }
