package topo

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"

	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/zksession"
)

// Pool records in ZooKeeper: the config (written by `shardctl pool set`
// with compare-and-swap), the status (last writer wins) and the members'
// ephemeral records. A missing config or status is reported with the
// session's error, so callers test errors.Is(err, zksession.ErrNoNode), as
// for move records.

// ErrPoolConfigChanged means SetPoolConfig's compare-and-swap found
// another version than expected (or a config created meanwhile).
var ErrPoolConfigChanged = errors.New("pool config changed")

// ReadPoolConfigData reads a pool config's bytes as stored, with its znode
// version, for readers that report an invalid config rather than fail on
// it (the supervisor publishes it as a swap result, `shardctl pool status`
// shows it).
func ReadPoolConfigData(ctx context.Context, s *zksession.Session, p Paths, pool string) ([]byte, int32, error) {
	data, st, err := s.Get(ctx, p.PoolConfig(pool))
	return data, st.Version, err
}

// ReadPoolConfig reads, decodes and validates a pool config, with its
// znode version for SetPoolConfig.
func ReadPoolConfig(ctx context.Context, s *zksession.Session, p Paths, pool string) (*PoolConfig, int32, error) {
	return readAs(ctx, s, p.PoolConfig(pool), DecodePoolConfig)
}

// WatchPoolConfig follows a pool's config record; each Node carries the
// record's bytes (DecodePoolConfig) and znode version, or Exists false.
func WatchPoolConfig(ctx context.Context, s *zksession.Session, p Paths, pool string) *zksession.Watch {
	return s.Watch(ctx, p.PoolConfig(pool))
}

// SetPoolConfig validates cfg and writes it as the pool's config by
// compare-and-swap: only if the config's znode version is still expect,
// or, with expect < 0, the version it reads just before writing (so that
// a concurrent writer in between is still detected). A missing config is
// created (with expect >= 0 that is an error: the caller expected one). It
// returns the new znode version and whether the config was created. A
// lost race wraps ErrPoolConfigChanged: re-read and decide again, never
// retried here, because the caller's config was based on what it read.
//
// It also creates whatever the pool's supervisors need and may not create
// themselves, each with the ACL of its kind: the pool's directory, its
// members directory and an empty status record. So running it again
// completes a pool made by an older version.
func SetPoolConfig(ctx context.Context, s *zksession.Session, p Paths, pool string, cfg *PoolConfig, expect int32) (int32, bool, error) {
	at := p.PoolConfig(pool)
	if err := cfg.Validate(); err != nil {
		return 0, false, &RecordError{Kind: "pool config", Path: at, Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
	}
	data, err := EncodePoolConfig(cfg)
	if err != nil {
		return 0, false, err
	}
	_, st, err := s.Get(ctx, at)
	switch {
	case errors.Is(err, zksession.ErrNoNode):
		if expect >= 0 {
			return 0, false, fmt.Errorf("pool config %s does not exist, but --expect-version %d was given", at, expect)
		}
		if err := createNode(ctx, s, p, at, data); err != nil {
			if errors.Is(err, zksession.ErrNodeExists) {
				return 0, false, &conflictError{fmt.Sprintf("pool config %s was created by someone else meanwhile; re-read it with `pool get` and retry", at), err}
			}
			return 0, false, err
		}
		return 0, true, createPoolNodes(ctx, s, p, pool)
	case err != nil:
		return 0, false, err
	}
	if expect < 0 {
		expect = st.Version
	}
	nst, err := s.Set(ctx, at, data, expect)
	if errors.Is(err, zksession.ErrBadVersion) {
		return 0, false, &conflictError{fmt.Sprintf("pool config %s changed (expected version %d): re-read it with `pool get` and retry: %v", at, expect, err), err}
	}
	if err != nil {
		return 0, false, err
	}
	return nst.Version, false, createPoolNodes(ctx, s, p, pool)
}

// createPoolNodes creates the pool's members directory and status record
// if they are missing (the status empty: no swap published yet).
func createPoolNodes(ctx context.Context, s *zksession.Session, p Paths, pool string) error {
	if err := createDir(ctx, s, p, p.PoolMembers(pool)); err != nil {
		return err
	}
	if err := createNode(ctx, s, p, p.PoolStatus(pool), nil); err != nil && !errors.Is(err, zksession.ErrNodeExists) {
		return err
	}
	return nil
}

// poolNodeMissing explains a supervisor's failure to create one of its
// pool's znodes that only the admin creates: the pool was never set up.
func poolNodeMissing(pool string, err error) error {
	if errors.Is(err, ErrNeedsAdmin) {
		return hint.New(fmt.Errorf("pool %s is not set up in ZooKeeper (%w)", pool, err),
			fmt.Sprintf("create it with `shardctl pool set %s --file CONFIG.json` as the cluster's admin", pool))
	}
	return err
}

// conflictError is SetPoolConfig's lost race: it reads as it always has
// and matches both ErrPoolConfigChanged and the session's error.
type conflictError struct {
	msg string
	err error
}

func (e *conflictError) Error() string   { return e.msg }
func (e *conflictError) Unwrap() []error { return []error{ErrPoolConfigChanged, e.err} }

// ReadPoolStatus reads a pool's last swap result; nil, nil when no
// supervisor has published one yet (no record, or the empty one `pool
// set` creates).
func ReadPoolStatus(ctx context.Context, s *zksession.Session, p Paths, pool string) (*PoolStatus, error) {
	data, _, err := s.Get(ctx, p.PoolStatus(pool))
	if errors.Is(err, zksession.ErrNoNode) || err == nil && len(data) == 0 {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return DecodePoolStatus(p.PoolStatus(pool), data)
}

// WritePoolStatus replaces a pool's status record, creating it (and the
// pool's directory, where the session may) if needed. Last writer wins: it
// reports the newest swap of any supervisor of the pool, nobody
// reads-modifies-writes it.
func WritePoolStatus(ctx context.Context, s *zksession.Session, p Paths, pool string, st PoolStatus) error {
	data, err := Encode(st)
	if err != nil {
		return err
	}
	at := p.PoolStatus(pool)
	_, err = s.Set(ctx, at, data, zksession.AnyVersion)
	if errors.Is(err, zksession.ErrNoNode) {
		err = createNode(ctx, s, p, at, data)
		if errors.Is(err, zksession.ErrNodeExists) {
			_, err = s.Set(ctx, at, data, zksession.AnyVersion) // another supervisor created it first
		}
	}
	return poolNodeMissing(pool, err)
}

// PoolState is what ZooKeeper holds about one pool, as `shardctl pool
// status` shows it.
type PoolState struct {
	ConfigPath    string
	ConfigVersion *int32 // nil: the pool has no config
	ConfigErr     error  // the config does not decode or validate
	Status        *PoolStatus
	Members       []Entry[PoolMember]
}

// ReadPoolState reads a pool's config version (and whether the config is
// valid), its last swap result and its members. An invalid config or
// member is reported in the result, an unreadable status record fails.
func ReadPoolState(ctx context.Context, s *zksession.Session, p Paths, pool string) (*PoolState, error) {
	ps := &PoolState{ConfigPath: p.PoolConfig(pool)}
	data, ver, err := ReadPoolConfigData(ctx, s, p, pool)
	switch {
	case err == nil:
		ps.ConfigVersion = &ver
		_, ps.ConfigErr = DecodePoolConfig(ps.ConfigPath, data)
	case !errors.Is(err, zksession.ErrNoNode):
		return nil, err
	}
	if ps.Status, err = ReadPoolStatus(ctx, s, p, pool); err != nil {
		return nil, err
	}
	if ps.Members, err = ListPoolMembers(ctx, s, p, pool); err != nil {
		return nil, err
	}
	return ps, nil
}

// ListPools lists the names of the cluster's pools (sorted). A cluster
// without a pools directory has none.
func ListPools(ctx context.Context, s *zksession.Session, p Paths) ([]string, error) {
	return listSorted(ctx, s, p.Pools())
}

// Entry is one record of a member directory: its name and path, and the
// decoded record, or the reason it did not decode (wrapping ErrMalformed).
type Entry[T any] struct {
	Name string
	Path string
	Rec  *T
	Err  error
}

// ListPoolMembers reads the member records of a pool's running
// supervisors, sorted by name. A record that vanishes while it is listed
// is left out; one that does not decode is listed with its error.
func ListPoolMembers(ctx context.Context, s *zksession.Session, p Paths, pool string) ([]Entry[PoolMember], error) {
	return listEntries(ctx, s, p.PoolMembers(pool), DecodePoolMember)
}

// ListRouters reads the member records of the running routers, sorted by
// name, as ListPoolMembers does.
func ListRouters(ctx context.Context, s *zksession.Session, p Paths) ([]Entry[RouterMember], error) {
	return listEntries(ctx, s, p.Routers(), DecodeRouterMember)
}

func listSorted(ctx context.Context, s *zksession.Session, dir string) ([]string, error) {
	names, _, err := s.Children(ctx, dir)
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	return names, nil
}

func listEntries[T any](ctx context.Context, s *zksession.Session, dir string, decode func(string, []byte) (*T, error)) ([]Entry[T], error) {
	names, err := listSorted(ctx, s, dir)
	if err != nil {
		return nil, err
	}
	var out []Entry[T]
	for _, n := range names {
		at := path.Join(dir, n)
		data, _, err := s.Get(ctx, at)
		if errors.Is(err, zksession.ErrNoNode) {
			continue // its owner just left
		}
		if err != nil {
			return nil, err
		}
		rec, err := decode(at, data)
		out = append(out, Entry[T]{Name: n, Path: at, Rec: rec, Err: err})
	}
	return out, nil
}

// PoolMemberRegistration is a supervisor's ephemeral member record at
// Paths.PoolMember(pool, member), kept alive across sessions until Remove.
type PoolMemberRegistration struct {
	e *zksession.Ephemeral
}

// RegisterPoolMember creates the member record of supervisor rec.Member
// in pool (the members directory lets readers register there). A pool
// whose members directory is missing is an error saying how to set the
// pool up, unless the session may create it (the admin; an open cluster).
func RegisterPoolMember(ctx context.Context, s *zksession.Session, p Paths, pool string, rec PoolMember) (*PoolMemberRegistration, error) {
	e, err := createEphemeralRecord(ctx, s, p, p.PoolMember(pool, rec.Member), rec)
	if err != nil {
		return nil, poolNodeMissing(pool, err)
	}
	return &PoolMemberRegistration{e: e}, nil
}

// Update replaces the record. When it fails because the session is away,
// the new record is still the one re-created when the session comes back.
func (r *PoolMemberRegistration) Update(ctx context.Context, rec PoolMember) error {
	return setEphemeralRecord(ctx, r.e, rec)
}

// PoolMemberHolder is who holds a member record: the record (nil when it
// does not decode: Err says why) and the session that owns the ephemeral
// node (Owner 0: a persistent node, which no supervisor writes).
type PoolMemberHolder struct {
	Rec   *PoolMember
	Err   error
	Owner int64
	// Creator is the x509 identity whose session created the record, as
	// its ACL says, in a cluster with x509 ACLs ("" otherwise). Unlike
	// the record's content, which its writer chose, it cannot be forged.
	Creator string
}

// ReadPoolMemberHolder reads the member record of member in pool and the
// session that owns it, so that a supervisor can tell whether the name is
// taken before it registers (zksession.ErrNoNode: it is free).
func ReadPoolMemberHolder(ctx context.Context, s *zksession.Session, p Paths, pool, member string) (*PoolMemberHolder, error) {
	at := p.PoolMember(pool, member)
	data, st, err := s.Get(ctx, at)
	if err != nil {
		return nil, err
	}
	rec, derr := DecodePoolMember(at, data)
	h := &PoolMemberHolder{Rec: rec, Err: derr, Owner: st.EphemeralOwner}
	h.Creator, err = MemberCreator(ctx, s, p, at)
	return h, err
}

// MemberCreator is the x509 identity that created the member record at,
// from its ACL, in a cluster with x509 ACLs; "" in other clusters, and
// when the ACL names no single creator (`shardctl acl check` reports
// such a record).
func MemberCreator(ctx context.Context, s *zksession.Session, p Paths, at string) (string, error) {
	r, err := ReadACLRule(ctx, s, p)
	if err != nil || !r.x509 {
		return "", err
	}
	acl, _, err := s.GetACL(ctx, at)
	if err != nil {
		return "", err
	}
	return r.memberCreator(acl), nil
}

// Remove deletes the record and stops keeping it alive.
func (r *PoolMemberRegistration) Remove(ctx context.Context) error { return removeMember(ctx, r.e) }

// removeMember deletes a member record and stops keeping it. In a cluster
// with x509 ACLs its owner may not delete it (nobody but the admin
// deletes in a member directory): the record then goes when the session
// ends, which a process removing its record is about to do.
func removeMember(ctx context.Context, e *zksession.Ephemeral) error {
	err := e.Delete(ctx)
	if errors.Is(err, zksession.ErrNoAuth) {
		return nil
	}
	return err
}

func createEphemeralRecord(ctx context.Context, s *zksession.Session, p Paths, at string, rec any) (*zksession.Ephemeral, error) {
	data, err := Encode(rec)
	if err != nil {
		return nil, err
	}
	e, err := createEphemeral(ctx, s, p, at, data)
	if errors.Is(err, zksession.ErrOwnedElsewhere) {
		// Name who took it when the ACL can say: another host's identity
		// is not this host's previous run.
		if c, cerr := MemberCreator(ctx, s, p, at); cerr == nil && c != "" && c != s.Identity() {
			err = fmt.Errorf("%w; created by the x509 identity %s, not this host's (%s)", err, c, s.Identity())
		}
	}
	return e, err
}

func setEphemeralRecord(ctx context.Context, e *zksession.Ephemeral, rec any) error {
	data, err := Encode(rec)
	if err != nil {
		return err
	}
	return e.Set(ctx, data)
}
