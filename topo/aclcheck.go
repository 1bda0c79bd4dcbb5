package topo

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/zksession"
)

// ACLRecordVersion is the newest ACL record format this build writes.
const ACLRecordVersion = 1

// ACLRecord is stored at Paths.ACLRecord() in a cluster with ACLs.
type ACLRecord struct {
	Version int `json:"version"`
	// ReaderRecords is the ACL of the records readers create (member
	// records; a pool's status when it is missing), as the rule gives it.
	ReaderRecords []ACLEntry `json:"reader_records"`
}

// ACLEntry is one entry of an ACL as zkCli shows it: scheme, id and
// permissions as letters of "cdrwa".
type ACLEntry struct {
	Scheme string `json:"scheme"`
	ID     string `json:"id"`
	Perms  string `json:"perms"`
}

func (e ACLEntry) String() string { return e.Scheme + ":" + e.ID + ":" + e.Perms }

const permLetters = "cdrwa"

var permBits = [...]int32{zk.PermCreate, zk.PermDelete, zk.PermRead, zk.PermWrite, zk.PermAdmin}

func permString(p int32) string {
	var b strings.Builder
	for i, bit := range permBits {
		if p&bit != 0 {
			b.WriteByte(permLetters[i])
		}
	}
	return b.String()
}

// Entries renders an ACL as entries, sorted, for comparison and output.
func Entries(acl []zk.ACL) []ACLEntry {
	out := make([]ACLEntry, len(acl))
	for i, e := range acl {
		out[i] = ACLEntry{Scheme: e.Scheme, ID: e.ID, Perms: permString(e.Perms)}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// FormatACL renders an ACL on one line, sorted.
func FormatACL(acl []zk.ACL) string {
	var parts []string
	for _, e := range Entries(acl) {
		parts = append(parts, e.String())
	}
	return strings.Join(parts, ",")
}

// ACL turns the record's entries back into an ACL.
func (r *ACLRecord) ACL() ([]zk.ACL, error) {
	if len(r.ReaderRecords) == 0 {
		return nil, errors.New("reader_records is empty")
	}
	var out []zk.ACL
	for _, e := range r.ReaderRecords {
		if e.Scheme == "" || e.ID == "" {
			return nil, fmt.Errorf("entry %q has no scheme or id", e)
		}
		if e.Scheme == "digest" && hidden(e.ID) {
			return nil, fmt.Errorf("entry %q has a hidden hash", e)
		}
		var perms int32
		for _, c := range e.Perms {
			i := strings.IndexRune(permLetters, c)
			if i < 0 {
				return nil, fmt.Errorf("entry %q: permission %q is not one of %s", e, c, permLetters)
			}
			perms |= permBits[i]
		}
		if perms == 0 {
			return nil, fmt.Errorf("entry %q has no permissions", e)
		}
		out = append(out, zk.ACL{Perms: perms, Scheme: e.Scheme, ID: e.ID})
	}
	return out, nil
}

// DecodeACLRecord decodes and validates an ACL record.
func DecodeACLRecord(znode string, data []byte) (*ACLRecord, error) {
	return decodeAs("acl record", znode, data, ACLRecordVersion, func(r *ACLRecord) error {
		_, err := r.ACL()
		return err
	})
}

// ReadACLRecord reads a cluster's ACL record; a missing one is the
// session's ErrNoNode.
func ReadACLRecord(ctx context.Context, s *zksession.Session, p Paths) (*ACLRecord, error) {
	r, _, err := readAs(ctx, s, p.ACLRecord(), DecodeACLRecord)
	return r, err
}

// aclRecordFor is the ACL record a rule publishes.
func aclRecordFor(r *ACLRule) ([]byte, error) {
	acl, err := r.ACL(KindReaderRecord)
	if err != nil {
		return nil, err
	}
	return Encode(ACLRecord{Version: ACLRecordVersion, ReaderRecords: Entries(acl)})
}

// ACLDiff is one znode whose ACL (What "acl"), or the ACL record whose
// content (What "content"), differs from the rule. Have is nil when the
// ACL record is missing.
type ACLDiff struct {
	Path string     `json:"path"`
	Kind string     `json:"kind"`
	What string     `json:"what"`
	Have []ACLEntry `json:"have"`
	Want []ACLEntry `json:"want"`
}

// ACLReport is what CheckACLs found, or RepairACLs changed.
type ACLReport struct {
	Cluster string    `json:"cluster"`
	Path    string    `json:"path"`
	Open    bool      `json:"open"`
	Checked int       `json:"checked"` // znodes compared
	Diffs   []ACLDiff `json:"differ"`
	// Patroni: the Patroni groups' znodes that anyone may write
	// (CheckPatroniACLs), which repair leaves to Patroni; PatroniChecked
	// counts the znodes looked at.
	Patroni        []ACLDiff `json:"patroni_open,omitempty"`
	PatroniChecked int       `json:"patroni_checked,omitempty"`
}

// CheckACLs walks the cluster's whole tree and lists every znode whose ACL
// differs from the rule for its kind, and the ACL record if it is missing
// or differs. It needs the admin identity (only the admin sees the hashes
// the rule is made of). Znodes that vanish during the walk are skipped.
func CheckACLs(ctx context.Context, s *zksession.Session, p Paths) (*ACLReport, error) {
	return walkACLs(ctx, s, p, false)
}

// RepairACLs is CheckACLs that also sets each differing ACL to the rule's
// and writes the ACL record; the report lists what it changed.
func RepairACLs(ctx context.Context, s *zksession.Session, p Paths) (*ACLReport, error) {
	return walkACLs(ctx, s, p, true)
}

func walkACLs(ctx context.Context, s *zksession.Session, p Paths, repair bool) (*ACLReport, error) {
	if ok, _, err := s.Exists(ctx, p.Cluster()); err != nil {
		return nil, err
	} else if !ok {
		return nil, hint.New(fmt.Errorf("%w: no record at %s", ErrNoCluster, p.Cluster()), "create it with `shardctl init`")
	}
	r, err := ReadACLRule(ctx, s, p)
	if err != nil {
		return nil, err
	}
	if r.readerView {
		return nil, fmt.Errorf("checking the ACLs of cluster %s %w (--zk-auth-file): ZooKeeper hides the hashes the rule is made of from everyone else", p.ClusterName(), ErrNeedsAdmin)
	}
	rep := &ACLReport{Cluster: p.ClusterName(), Path: p.Cluster(), Open: r.open}
	visit := func(at string, have []zk.ACL) (bool, error) {
		rep.Checked++
		kind := p.KindOf(at)
		if kind == KindMemberRecord && r.x509 {
			// Its creator is whoever its ACL names; a record whose ACL
			// names no single creator, or names one with other rights,
			// cannot be set right (who made it?): repair deletes it, and a
			// live owner's session creates it again with the rule's ACL.
			creator := r.memberCreator(have)
			want, err := r.MemberRecordACL(creator)
			if creator == "" || err != nil {
				want, _ = r.MemberRecordACL("<its creator>")
			}
			if creator == "" || !slices.Equal(Entries(have), Entries(want)) {
				if repair {
					if err := s.Delete(ctx, at, zksession.AnyVersion); err != nil && !errors.Is(err, zksession.ErrNoNode) {
						return false, err
					}
				}
				rep.Diffs = append(rep.Diffs, ACLDiff{Path: at, Kind: kind.String(), What: "acl", Have: Entries(have), Want: Entries(want)})
			}
			return false, nil // ephemeral: no children
		}
		want, err := r.ACL(kind)
		if err != nil {
			return false, err
		}
		if !slices.Equal(Entries(have), Entries(want)) {
			if repair {
				if _, err := setACL(ctx, s, r, p, at); err != nil && !errors.Is(err, zksession.ErrNoNode) {
					return false, err
				}
			}
			rep.Diffs = append(rep.Diffs, ACLDiff{Path: at, Kind: kind.String(), What: "acl", Have: Entries(have), Want: Entries(want)})
		}
		return true, nil
	}
	if err := walkTree(ctx, s, p.Cluster(), visit); err != nil {
		return nil, err
	}
	if !r.open && !r.x509 {
		d, err := checkACLRecord(ctx, s, p, r, repair)
		if err != nil {
			return nil, err
		}
		if d != nil {
			rep.Diffs = append(rep.Diffs, *d)
		}
	}
	return rep, nil
}

// checkACLRecord compares the ACL record with the rule (and writes it,
// with repair): nil when it is right.
func checkACLRecord(ctx context.Context, s *zksession.Session, p Paths, r *ACLRule, repair bool) (*ACLDiff, error) {
	want, _ := r.ACL(KindReaderRecord)
	d := &ACLDiff{Path: p.ACLRecord(), Kind: KindRecord.String(), What: "content", Want: Entries(want)}
	rec, err := ReadACLRecord(ctx, s, p)
	switch {
	case errors.Is(err, zksession.ErrNoNode):
	case errors.Is(err, ErrMalformed):
		d.Have = []ACLEntry{}
	case err != nil:
		return nil, err
	default:
		d.Have = rec.ReaderRecords
		if have, _ := rec.ACL(); slices.Equal(Entries(have), d.Want) {
			return nil, nil
		}
	}
	if repair {
		data, err := aclRecordFor(r)
		if err != nil {
			return nil, err
		}
		if d.Have == nil {
			err = createNode(ctx, s, p, p.ACLRecord(), data)
		} else {
			_, err = s.Set(ctx, p.ACLRecord(), data, zksession.AnyVersion)
		}
		if err != nil {
			return nil, err
		}
	}
	return d, nil
}

// CheckPatroniACLs walks the records of the Patroni groups in dirs
// (PatroniDir of each group's namespace and scope), their namespace
// included, and lists every znode that lets anyone (world:anyone) do more
// than read: such a znode lets any host that reaches the ensemble set an
// archive_command, turn synchronous replication off or force a failover.
// Want is the ACL without those permissions. Patroni owns these znodes,
// so nothing here repairs them (Patroni's zookeeper.set_acls does). A
// group without records is skipped; the count is of znodes checked.
func CheckPatroniACLs(ctx context.Context, s *zksession.Session, dirs []string) ([]ACLDiff, int, error) {
	var diffs []ACLDiff
	checked := 0
	check := func(at string, have []zk.ACL) {
		checked++
		var want []zk.ACL
		for _, e := range have {
			if isWorld(e) {
				if e.Perms &= zk.PermRead; e.Perms == 0 {
					continue
				}
			}
			want = append(want, e)
		}
		if !slices.Equal(Entries(have), Entries(want)) {
			diffs = append(diffs, ACLDiff{Path: at, Kind: "patroni", What: "acl", Have: Entries(have), Want: Entries(want)})
		}
	}
	namespaces := map[string]bool{}
	dirs = slices.Compact(slices.Sorted(slices.Values(dirs)))
	for _, dir := range dirs {
		if ok, _, err := s.Exists(ctx, dir); err != nil {
			return nil, 0, err
		} else if !ok {
			continue
		}
		if ns := path.Dir(dir); !namespaces[ns] {
			namespaces[ns] = true
			if err := walkTree(ctx, s, ns, func(at string, acl []zk.ACL) (bool, error) { check(at, acl); return false, nil }); err != nil {
				return nil, 0, err
			}
		}
		if err := walkTree(ctx, s, dir, func(at string, acl []zk.ACL) (bool, error) { check(at, acl); return true, nil }); err != nil {
			return nil, 0, err
		}
	}
	return diffs, checked, nil
}

// walkTree visits at and every znode below it, parents first and children
// in name order, with each one's ACL; visit says whether to go below. A
// znode that vanishes during the walk is skipped.
func walkTree(ctx context.Context, s *zksession.Session, at string, visit func(at string, acl []zk.ACL) (bool, error)) error {
	acl, _, err := s.GetACL(ctx, at)
	if errors.Is(err, zksession.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	if down, err := visit(at, acl); err != nil || !down {
		return err
	}
	kids, _, err := s.Children(ctx, at)
	if errors.Is(err, zksession.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	sort.Strings(kids)
	for _, k := range kids {
		if err := walkTree(ctx, s, path.Join(at, k), visit); err != nil {
			return err
		}
	}
	return nil
}
