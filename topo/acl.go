package topo

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/zksession"
)

// This file is the one place in topo that creates znodes or sets their
// ACLs (internal/archtest checks it): every create, persistent or
// ephemeral, a lock, a parent or an operation of a transaction, takes the
// ACL that the cluster's rule gives the kind of its path. See "Security
// model" in docs/zookeeper-layout.md.

// NodeKind is what a znode is for the ACL rule.
type NodeKind int

const (
	// KindRecord: records and directories. Admin: all; reader (or anyone,
	// when the cluster has no reader identity): read.
	KindRecord NodeKind = iota + 1
	// KindMemberDir: routers/ and pools/<pool>/members/. As KindRecord,
	// and readers may also create children (their member records) and,
	// with digest identities (all web heads share one), delete them. With
	// x509 identities nobody but the admin deletes there: ZooKeeper checks
	// a delete against the parent's ACL, so a delete permission for one
	// host would be one for every host's record.
	KindMemberDir
	// KindReaderRecord: a pool's status, which every supervisor of the
	// pool writes. The admin's records identity
	// (zksession.RecordsCredential) or x509 admin: all; reader: read and
	// write.
	KindReaderRecord
	// KindOutside: znodes beside the clusters (the root, .probes), which
	// no cluster's rule covers: open, as they always were.
	KindOutside
	// KindMemberRecord: a router's or a supervisor's ephemeral member
	// record. With digest identities as KindReaderRecord; with x509 ones
	// its creator may read and write it, the admin everything, readers
	// read (ACLRule.MemberRecordACL).
	KindMemberRecord
)

func (k NodeKind) String() string {
	switch k {
	case KindRecord:
		return "record"
	case KindMemberDir:
		return "member-dir"
	case KindReaderRecord:
		return "reader-record"
	case KindOutside:
		return "outside"
	case KindMemberRecord:
		return "member-record"
	}
	return fmt.Sprintf("NodeKind(%d)", int(k))
}

// KindOf says which kind of znode at is. Anything in the cluster that the
// layout does not name is a KindRecord, the strictest kind.
func (p Paths) KindOf(at string) NodeKind {
	c := p.Cluster()
	if at == c {
		return KindRecord
	}
	if !strings.HasPrefix(at, c+"/") {
		return KindOutside
	}
	rel := strings.Split(strings.TrimPrefix(at, c+"/"), "/")
	switch {
	case rel[0] == "routers" && len(rel) == 1, rel[0] == "pools" && len(rel) == 3 && rel[2] == "members":
		return KindMemberDir
	case rel[0] == "routers" && len(rel) == 2,
		rel[0] == "pools" && len(rel) == 4 && rel[2] == "members":
		return KindMemberRecord
	case rel[0] == "pools" && len(rel) == 3 && rel[2] == "status":
		return KindReaderRecord
	}
	return KindRecord
}

// ACLRecord is where a cluster with ACLs publishes, for its readers, the
// ACL of the records they create (KindReaderRecord). Readers cannot
// derive it from the cluster's own ACL, because ZooKeeper hides digest
// hashes from them; the admin writes it (`shardctl init`, `shardctl acl
// repair`) and `shardctl acl check` compares it with the rule.
func (p Paths) ACLRecord() string { return path.Join(p.Cluster(), "acl") }

// ErrNeedsAdmin means a process without the cluster's admin identity had
// to do what only the admin does: create a znode other than a member
// record, or check ACLs.
var ErrNeedsAdmin = errors.New("needs the cluster's admin identity")

// ErrNoIdentity means a process without a certificate identity had to
// create a member record in a cluster whose ACLs are by certificate: the
// record's ACL names its creator.
var ErrNoIdentity = errors.New("needs a certificate identity (ZooKeeper over TLS with a client certificate)")

// ErrNoACLRecord means a cluster with ACLs has no ACL record (it was
// created by an older shardctl), so a reader cannot tell which ACL its
// records take.
var ErrNoACLRecord = errors.New("the cluster has ACLs but no ACL record")

// ACLRule is a cluster's ACL rule: the ACL of each kind of znode, derived
// from the ACL of the cluster's own znode, the one source of truth. The
// entries with all permissions are the admin identities, all digest or
// all x509; every other entry (the reader identity, or world:anyone when
// there is none) is a reader. A cluster whose znode grants anyone
// everything is open: every kind is open, as in development.
//
// With x509 admins (`shardctl init --x509-admin`) every host has its own
// identity, so member records are kept to their creators: the creator
// alone may change its record and nobody but the admin may delete one
// (docs/security.md). Readers see x509 ids (ZooKeeper hides only digest
// hashes), so they derive the rule themselves; no ACL record is needed.
type ACLRule struct {
	open    bool
	x509    bool     // the admins are x509 identities
	admins  []zk.ACL // the admin identities, all permissions
	owners  []zk.ACL // their records identities, all permissions
	readers []zk.ACL // the reader ids; the kind decides their permissions
	// readerView: derived by a process without the admin identity, which
	// sees no hashes and so knows only readerRecs, from the ACL record.
	readerView bool
	readerRecs []zk.ACL // nil in a reader view without an ACL record
}

// OpenACL is the ACL of an open cluster's znodes, and of znodes outside
// every cluster.
func OpenACL() []zk.ACL { return zk.WorldACL(zk.PermAll) }

// NewACLRule derives the rule from the ACL of a cluster's znode, as the
// admin sees it (empty: open).
func NewACLRule(clusterACL []zk.ACL) (*ACLRule, error) {
	r := &ACLRule{}
	if len(clusterACL) == 0 || slices.ContainsFunc(clusterACL, func(e zk.ACL) bool { return isWorld(e) && e.Perms == zk.PermAll }) {
		r.open = true
		return r, nil
	}
	for _, e := range clusterACL {
		if e.Scheme == "digest" && hidden(e.ID) {
			return nil, fmt.Errorf("the cluster's ACL shows hidden digest hashes (%s): it was read without the admin identity", FormatACL(clusterACL))
		}
		if e.Perms != zk.PermAll {
			r.readers = append(r.readers, zk.ACL{Scheme: e.Scheme, ID: e.ID})
			continue
		}
		switch e.Scheme {
		case "digest":
			rc, err := zksession.RecordsCredential(e.ID)
			if err != nil {
				return nil, err
			}
			r.admins = append(r.admins, e)
			r.owners = append(r.owners, zk.ACL{Perms: zk.PermAll, Scheme: "digest", ID: rc.DigestID()})
		case "x509":
			// An x509 admin owns the records readers create itself: its
			// id is no secret, so nothing needs deriving.
			r.x509 = true
			r.admins = append(r.admins, e)
			r.owners = append(r.owners, e)
		default:
			return nil, fmt.Errorf("the cluster's ACL gives all permissions to %s:%s, which is neither a digest nor an x509 identity; cannot tell its admin", e.Scheme, e.ID)
		}
	}
	if len(r.admins) == 0 {
		return nil, fmt.Errorf("the cluster's ACL (%s) has no admin: no digest or x509 identity with all permissions", FormatACL(clusterACL))
	}
	if r.x509 && slices.ContainsFunc(r.admins, func(e zk.ACL) bool { return e.Scheme != "x509" }) {
		return nil, fmt.Errorf("the cluster's ACL (%s) mixes digest and x509 admins: give it one kind", FormatACL(clusterACL))
	}
	r.readerRecs = r.kind(r.owners, zk.PermRead|zk.PermWrite)
	return r, nil
}

// ClusterACLRule is the rule of a cluster created by admin with readers
// reading as reader (nil: anyone reads; admin nil: open), as `shardctl
// init` creates it.
func ClusterACLRule(admin, reader *zksession.Credential) *ACLRule {
	r, err := NewACLRule(zksession.ClusterACL(admin, reader))
	if err != nil {
		panic(err) // ClusterACL always has its admin
	}
	return r
}

func isWorld(e zk.ACL) bool { return e.Scheme == "world" && e.ID == "anyone" }

// hidden: ZooKeeper replaced the hash of a digest id with "x" for a caller
// without the admin permission.
func hidden(id string) bool { return strings.HasSuffix(id, ":x") }

// Open reports whether the cluster is open (created without an admin).
func (r *ACLRule) Open() bool { return r.open }

// X509 reports whether the cluster's admins are x509 identities, and so
// member records are kept to their creators.
func (r *ACLRule) X509() bool { return r.x509 }

// kind is base followed by the readers with perms.
func (r *ACLRule) kind(base []zk.ACL, perms int32) []zk.ACL {
	out := slices.Clone(base)
	for _, e := range r.readers {
		out = append(out, zk.ACL{Perms: perms, Scheme: e.Scheme, ID: e.ID})
	}
	return out
}

// ACL is the ACL the rule gives znodes of kind k. In a reader's view only
// KindReaderRecord is known; the others are ErrNeedsAdmin, since only the
// admin creates them.
func (r *ACLRule) ACL(k NodeKind) ([]zk.ACL, error) {
	if r.open || k == KindOutside {
		return OpenACL(), nil
	}
	if k == KindMemberRecord && !r.x509 {
		k = KindReaderRecord // digest: one shared identity, nothing to tell apart
	}
	if k == KindReaderRecord {
		if r.readerRecs == nil {
			return nil, hint.New(fmt.Errorf("%w (it was created by an older shardctl)", ErrNoACLRecord), "run `shardctl acl repair` as the admin")
		}
		return slices.Clone(r.readerRecs), nil
	}
	if r.readerView {
		return nil, fmt.Errorf("a %s %w, and this process is not the admin", k, ErrNeedsAdmin)
	}
	switch k {
	case KindRecord:
		return r.kind(r.admins, zk.PermRead), nil
	case KindMemberDir:
		if r.x509 {
			return r.kind(r.admins, zk.PermRead|zk.PermCreate), nil
		}
		return r.kind(r.admins, zk.PermRead|zk.PermCreate|zk.PermDelete), nil
	case KindMemberRecord:
		return nil, fmt.Errorf("a member record's ACL names its creator: use MemberRecordACL")
	}
	return nil, fmt.Errorf("no ACL for znode kind %s", k)
}

// MemberRecordACL is the ACL of a member record created by the session
// whose x509 identity is creator: creator read and write, the admins all,
// readers read. In a digest or open cluster it is ACL(KindMemberRecord),
// whoever the creator.
func (r *ACLRule) MemberRecordACL(creator string) ([]zk.ACL, error) {
	if r.open || !r.x509 {
		return r.ACL(KindMemberRecord)
	}
	if creator == "" {
		return nil, hint.New(fmt.Errorf("a member record in a cluster with x509 ACLs %w", ErrNoIdentity),
			"pass --zk-tls-ca, --zk-tls-cert and --zk-tls-key with this host's certificate")
	}
	var out []zk.ACL
	if !slices.ContainsFunc(r.owners, func(e zk.ACL) bool { return e.ID == creator }) {
		out = append(out, zk.ACL{Perms: zk.PermRead | zk.PermWrite, Scheme: "x509", ID: creator})
	}
	out = append(out, r.owners...)
	return append(out, r.kind(nil, zk.PermRead)...), nil
}

// memberCreator is the creator an x509 member record's ACL names: its one
// x509 entry that is not an admin's, "" if there is none or several.
func (r *ACLRule) memberCreator(acl []zk.ACL) string {
	creator := ""
	for _, e := range acl {
		if e.Scheme != "x509" || slices.ContainsFunc(r.owners, func(o zk.ACL) bool { return o.ID == e.ID }) {
			continue
		}
		if creator != "" {
			return ""
		}
		creator = e.ID
	}
	return creator
}

// ruleKey keys a cluster's rule in its session's values.
type ruleKey string

// ReadACLRule returns the rule of the cluster at p, read once per session
// from the ACL of the cluster's znode (and, by a reader, from its ACL
// record). A cluster that does not exist yet is open and not remembered:
// nodes created before `shardctl init` are open, as they always were.
func ReadACLRule(ctx context.Context, s *zksession.Session, p Paths) (*ACLRule, error) {
	key := ruleKey(p.Cluster())
	if v, ok := s.Value(key); ok {
		return v.(*ACLRule), nil
	}
	acl, _, err := s.GetACL(ctx, p.Cluster())
	if errors.Is(err, zksession.ErrNoNode) {
		return &ACLRule{open: true}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the ACL of cluster %s: %w", p.ClusterName(), err)
	}
	if !slices.ContainsFunc(acl, func(e zk.ACL) bool { return e.Scheme == "digest" && hidden(e.ID) }) {
		r, err := NewACLRule(acl)
		if err != nil {
			return nil, fmt.Errorf("cluster %s at %s: %w", p.ClusterName(), p.Cluster(), err)
		}
		s.SetValue(key, r)
		return r, nil
	}
	r := &ACLRule{readerView: true}
	rec, err := ReadACLRecord(ctx, s, p)
	switch {
	case errors.Is(err, zksession.ErrNoNode):
		return r, nil // not remembered: `acl repair` may write it any time
	case err != nil:
		return nil, err
	}
	if r.readerRecs, err = rec.ACL(); err != nil {
		return nil, &RecordError{Kind: "acl record", Path: p.ACLRecord(), Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
	}
	s.SetValue(key, r)
	return r, nil
}

// rememberRule sets the session's rule of the cluster at p (nil: forget
// it), for the process that creates or deletes the cluster and so knows.
func rememberRule(s *zksession.Session, p Paths, r *ACLRule) {
	if r == nil {
		s.DeleteValue(ruleKey(p.Cluster()))
		return
	}
	s.SetValue(ruleKey(p.Cluster()), r)
}

// aclFor is the ACL of the znode at, by its kind, and whether this process
// may create it at all: a reader creates only in member directories.
func aclFor(ctx context.Context, s *zksession.Session, p Paths, at string) ([]zk.ACL, error) {
	k := p.KindOf(at)
	if k == KindOutside {
		return OpenACL(), nil
	}
	r, err := ReadACLRule(ctx, s, p)
	if err != nil {
		return nil, err
	}
	return r.createACL(p, at, s.Identity())
}

// createACL is the ACL a session with x509 identity creator gives the
// znode at.
func (r *ACLRule) createACL(p Paths, at, creator string) ([]zk.ACL, error) {
	k := p.KindOf(at)
	if r.readerView && p.KindOf(path.Dir(at)) != KindMemberDir {
		return nil, fmt.Errorf("creating %s %w (readers create only member records), and this process is not the admin", at, ErrNeedsAdmin)
	}
	var acl []zk.ACL
	var err error
	if k == KindMemberRecord {
		acl, err = r.MemberRecordACL(creator)
	} else {
		acl, err = r.ACL(k)
	}
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", at, err)
	}
	return acl, nil
}

// createChild creates the persistent znode at with data under a parent
// that must exist (zksession.ErrNoNode if not: a child record never
// brings back a record that was deleted).
func createChild(ctx context.Context, s *zksession.Session, p Paths, at string, data []byte) error {
	acl, err := aclFor(ctx, s, p, at)
	if err != nil {
		return err
	}
	return s.CreateWithACL(ctx, at, data, acl)
}

// createNode creates the persistent znode at with data, and any missing
// parents (empty), each with the ACL of its kind.
func createNode(ctx context.Context, s *zksession.Session, p Paths, at string, data []byte) error {
	acl, err := aclFor(ctx, s, p, at)
	if err != nil {
		return err
	}
	err = s.CreateWithACL(ctx, at, data, acl)
	if errors.Is(err, zksession.ErrNoNode) {
		if err := createDir(ctx, s, p, path.Dir(at)); err != nil {
			return err
		}
		err = s.CreateWithACL(ctx, at, data, acl)
	}
	return err
}

// createDir makes sure the directory at exists, creating it and its
// missing parents as createNode does. Only znodes found missing are
// created: ZooKeeper refuses a create where the caller may not create,
// even of a znode that exists.
func createDir(ctx context.Context, s *zksession.Session, p Paths, at string) error {
	if at == "/" {
		return nil
	}
	err := createNode(ctx, s, p, at, nil)
	if errors.Is(err, zksession.ErrNodeExists) {
		return nil
	}
	return err
}

// createEphemeral creates the ephemeral znode at (kept alive across
// sessions, see zksession.Ephemeral), creating missing parents.
func createEphemeral(ctx context.Context, s *zksession.Session, p Paths, at string, data []byte) (*zksession.Ephemeral, error) {
	return withParents(ctx, s, p, at, func(acl []zk.ACL) (*zksession.Ephemeral, error) {
		return s.CreateEphemeral(ctx, at, data, acl)
	})
}

// tryLock takes the lock at (zksession.TryLock), creating missing parents.
func tryLock(ctx context.Context, s *zksession.Session, p Paths, at string, holder []byte) (*zksession.Lock, error) {
	return withParents(ctx, s, p, at, func(acl []zk.ACL) (*zksession.Lock, error) {
		return s.TryLock(ctx, at, holder, acl)
	})
}

// withParents calls create with the ACL of at's kind and, if at's parent
// is missing, creates the parents and calls it again.
func withParents[T any](ctx context.Context, s *zksession.Session, p Paths, at string, create func([]zk.ACL) (T, error)) (T, error) {
	acl, err := aclFor(ctx, s, p, at)
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := create(acl)
	if errors.Is(err, zksession.ErrNoNode) {
		if err := createDir(ctx, s, p, path.Dir(at)); err != nil {
			return v, err
		}
		v, err = create(acl)
	}
	return v, err
}

// waitLock waits for the lock at (zksession.Lock), creating missing
// parents first.
func waitLock(ctx context.Context, s *zksession.Session, p Paths, at string, holder []byte, onWait func(*zksession.LockedError)) (*zksession.Lock, error) {
	acl, err := aclFor(ctx, s, p, at)
	if err != nil {
		return nil, err
	}
	if err := createDir(ctx, s, p, path.Dir(at)); err != nil {
		return nil, err
	}
	return s.Lock(ctx, at, holder, acl, onWait)
}

// newNode is one znode of createTogether.
type newNode struct {
	path string
	data []byte
}

// createTogether creates nodes in one transaction, all or none, each with
// the ACL r gives its kind (r, not the session's rule: the cluster whose
// znode r is derived from may be among them).
func createTogether(ctx context.Context, s *zksession.Session, p Paths, r *ACLRule, nodes ...newNode) error {
	ops := make([]zksession.Op, len(nodes))
	for i, n := range nodes {
		acl, err := r.createACL(p, n.path, s.Identity())
		if err != nil {
			return err
		}
		ops[i] = zksession.CreateOp(n.path, n.data, acl)
	}
	_, err := s.Multi(ctx, ops...)
	return err
}

// setACL replaces the ACL of the znode at with the one the rule gives its
// kind, for `shardctl acl repair`.
func setACL(ctx context.Context, s *zksession.Session, r *ACLRule, p Paths, at string) ([]zk.ACL, error) {
	acl, err := r.ACL(p.KindOf(at))
	if err != nil {
		return nil, err
	}
	return acl, s.SetACL(ctx, at, acl, zksession.AnyVersion)
}

// createDeleteOps are the two operations that create the znode at (with
// the ACL of its kind, its parent made first) and delete it again: in a
// zksession.Multi they assert that nothing is at, and change nothing.
func createDeleteOps(ctx context.Context, s *zksession.Session, p Paths, at string) ([]zksession.Op, error) {
	acl, err := aclFor(ctx, s, p, at)
	if err != nil {
		return nil, err
	}
	if err := createDir(ctx, s, p, path.Dir(at)); err != nil {
		return nil, err
	}
	return []zksession.Op{zksession.CreateOp(at, nil, acl), zksession.DeleteOp(at, zksession.AnyVersion)}, nil
}
