package zksession

import (
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/internal/pki"
	"go.uber.org/zap"
)

// Defaults for Config fields left zero.
const (
	DefaultSessionTimeout = 10 * time.Second
	DefaultOpTimeout      = 5 * time.Second
)

// Config says how to reach ZooKeeper and as whom.
type Config struct {
	// Connect is a ZooKeeper connect string: "host:port,host:port[/chroot]".
	Connect string
	// SessionTimeout is the timeout asked of the server; the server clamps it
	// to its min/max, and the negotiated value drives the state machine.
	SessionTimeout time.Duration
	// OpTimeout bounds every call that has no earlier context deadline.
	OpTimeout time.Duration
	// Auth holds the identities added to the session (digest scheme). Each
	// comes with its records identity (RecordsCredential), so that a
	// cluster's admin can read and repair the records readers create.
	Auth []Credential
	// ACL is the default of Create, CreateAll, CreateOp and CreateEphemeral
	// when they are given none. Nil means open. shardvisor's records never
	// use it: topo gives each znode the ACL of its kind.
	ACL []zk.ACL
	// Logger receives the library's logs and this package's lifecycle
	// events. Nil means zap.NewNop().
	Logger *zap.Logger
	// Identity is the x509 identity the session authenticates as when Dial
	// presents a client certificate: its subject DN as ZooKeeper's x509
	// provider prints it ("CN=web1,OU=webhead,O=shardvisor"). topo names it
	// as the owner of the member records this session creates in a
	// cluster with x509 ACLs. Empty: no certificate.
	Identity string
	// Dial opens each connection to a server; nil means net.DialTimeout.
	// For callers that wrap the connection, such as a benchmark counting
	// the bytes ZooKeeper sends (bench/mapprop).
	Dial func(network, address string, timeout time.Duration) (net.Conn, error)
}

// ConnectString is a parsed ZooKeeper connect string.
type ConnectString struct {
	Servers []string
	Chroot  string // "" or "/a/b"
}

// ParseConnect parses "host:port,host:port[/chroot]". Every server needs a
// port, so a typo fails here rather than as an endless reconnect loop.
func ParseConnect(s string) (ConnectString, error) {
	var cs ConnectString
	s = strings.TrimSpace(s)
	if s == "" {
		return cs, errors.New("zookeeper connect string is empty (want host:port[,host:port...][/chroot])")
	}
	hosts := s
	if i := strings.IndexByte(s, '/'); i >= 0 {
		hosts, cs.Chroot = s[:i], strings.TrimRight(s[i:], "/")
		if cs.Chroot != "" {
			if err := validatePath(cs.Chroot); err != nil {
				return cs, fmt.Errorf("zookeeper connect string %q: chroot: %w", s, err)
			}
		}
	}
	for _, h := range strings.Split(hosts, ",") {
		h = strings.TrimSpace(h)
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" || port == "" {
			return cs, fmt.Errorf("zookeeper connect string %q: server %q is not host:port", s, h)
		}
		cs.Servers = append(cs.Servers, h)
	}
	return cs, nil
}

// String renders the connect string back, chroot included.
func (cs ConnectString) String() string {
	return strings.Join(cs.Servers, ",") + cs.Chroot
}

// Credential is a ZooKeeper digest identity. Its String never shows the
// password, so it is safe to log.
type Credential struct {
	User     string
	Password string
}

// ParseCredential parses "user:password".
func ParseCredential(s string) (Credential, error) {
	s = strings.TrimSpace(s)
	user, pass, ok := strings.Cut(s, ":")
	if !ok || user == "" || pass == "" {
		return Credential{}, errors.New("zookeeper credential must be user:password with both parts non-empty")
	}
	return Credential{User: user, Password: pass}, nil
}

// LoadCredential reads a credential from value, or, when value is empty,
// from file (its first line). Both empty means no credential (nil, nil).
func LoadCredential(value, file string) (*Credential, error) {
	if value == "" && file == "" {
		return nil, nil
	}
	if value == "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("read zookeeper credential file: %w", err)
		}
		value, _, _ = strings.Cut(string(b), "\n")
		value = strings.TrimSpace(value)
	}
	c, err := ParseCredential(value)
	if err != nil {
		if file != "" {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		return nil, err
	}
	return &c, nil
}

func (c Credential) String() string { return "digest:" + c.User + ":<redacted>" }

// DigestID is the identity as ZooKeeper's digest ACL entries name it,
// "user:base64(sha1(user:password))".
func (c Credential) DigestID() string {
	h := sha1.Sum([]byte(c.User + ":" + c.Password))
	return c.User + ":" + base64.StdEncoding.EncodeToString(h[:])
}

// RecordsCredential derives, from an admin identity's digest ID
// ("user:hash"), the identity that owns the records readers create
// (member records, pool status): "<user>+records" with a password that is
// an HMAC of the hash. Readers must name that owner in those records'
// ACLs, but ZooKeeper never shows them the admin's own hash (it would let
// them guess the admin password offline, CVE-2019-0201); the derived
// identity's hash is safe to show them, because its password is 256
// random-looking bits that only a holder of the admin's hash can compute.
// Every session adds the records identity of each of its credentials
// (Open), so the admin holds it without being configured for it.
func RecordsCredential(digestID string) (Credential, error) {
	user, hash, ok := strings.Cut(digestID, ":")
	if !ok || user == "" || hash == "" || hash == "x" {
		return Credential{}, fmt.Errorf("digest id %q is not user:hash (a hash shown as x was hidden by ZooKeeper: only the admin sees it)", digestID)
	}
	mac := hmac.New(sha256.New, []byte(hash))
	mac.Write([]byte("shardvisor records identity\x00" + user))
	return Credential{User: user + "+records", Password: base64.RawURLEncoding.EncodeToString(mac.Sum(nil))}, nil
}

// GoString keeps %#v from printing the password too.
func (c Credential) GoString() string { return c.String() }

// ClusterACL is the ACL for a cluster's nodes: admin may do everything; the
// reader identity may only read. With no reader, anyone may read. With no
// admin, the tree is open (development only).
func ClusterACL(admin, reader *Credential) []zk.ACL {
	if admin == nil {
		return zk.WorldACL(zk.PermAll)
	}
	acl := zk.DigestACL(zk.PermAll, admin.User, admin.Password)
	if reader != nil {
		acl = append(acl, zk.DigestACL(zk.PermRead, reader.User, reader.Password)...)
	} else {
		acl = append(acl, zk.WorldACL(zk.PermRead)...)
	}
	return acl
}

// X509ClusterACL is the ACL for a cluster whose admin is the x509
// identity adminDN (a subject DN as ZooKeeper prints it): the admin may do
// everything, anyone may read. "Anyone" on an ensemble that takes only
// TLS clients with a certificate of the cluster's CA is a host of the
// cluster; reading is not what must be kept from them (docs/security.md).
func X509ClusterACL(adminDN string) []zk.ACL {
	return []zk.ACL{{Perms: zk.PermAll, Scheme: "x509", ID: adminDN}, {Perms: zk.PermRead, Scheme: "world", ID: "anyone"}}
}

// MemberACL is the ACL for directories where readers register their own
// ephemeral member nodes (routers, supervisors): readers may also create
// and delete children there.
func MemberACL(admin, reader *Credential) []zk.ACL {
	acl := ClusterACL(admin, reader)
	if admin == nil {
		return acl
	}
	out := append([]zk.ACL(nil), acl...)
	for i := range out {
		if out[i].Perms == zk.PermRead {
			out[i].Perms = zk.PermRead | zk.PermCreate | zk.PermDelete
		}
	}
	return out
}

func validatePath(p string) error {
	if p == "" || p[0] != '/' {
		return fmt.Errorf("path %q must start with /", p)
	}
	if p != "/" && strings.HasSuffix(p, "/") {
		return fmt.Errorf("path %q must not end with /", p)
	}
	if strings.Contains(p, "//") {
		return fmt.Errorf("path %q has an empty component", p)
	}
	for _, part := range strings.Split(p[1:], "/") {
		if part == "." || part == ".." {
			return fmt.Errorf("path %q has a relative component", p)
		}
	}
	return nil
}

// UseTLS makes the session dial ZooKeeper over TLS with the PEM files ca
// (the servers' CA), cert and key (this host's certificate): each server's
// name is checked against the address dialled, and the certificate's
// subject becomes the session's x509 identity (Identity). The files are
// read again at each connection when they changed on disk (a rotation
// keeps the subject). All three empty: nothing changes (plain).
func (c *Config) UseTLS(ca, cert, key string) error {
	f := pki.Files{CA: ca, Cert: cert, Key: key}
	if f == (pki.Files{}) {
		return nil
	}
	// The files are read again when they change (a rotation): the next
	// connection, a reconnect included, uses them, with no restart.
	dial, err := f.ReloadingDialer()
	if err != nil {
		return err
	}
	dn, err := f.SubjectDN()
	if err != nil {
		return err
	}
	c.Dial, c.Identity = dial, dn
	return nil
}
