// Package pki makes and loads the certificates shardvisor's hosts prove
// who they are with: a CA, one certificate per role and host, and the TLS
// configurations that present and check them.
//
// Identities are certificates because ZooKeeper's x509 authentication,
// Patroni's set_acls and its REST API's verify_client all understand them,
// and a digest password travels in clear on a plain ZooKeeper connection.
// The subject names a role (OU) and a host (CN): ZooKeeper's
// X509AuthenticationProvider takes the whole subject DN as the identity an
// ACL names, so "CN=web1,OU=webhead,O=shardvisor" is one web head and no
// other.
//
// The dev environment makes its CA here; production brings its own CA and
// files in the same layout (docs/security.md).
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// Organization is the O of every subject this package issues.
const Organization = "shardvisor"

// Identity is who a certificate says its holder is.
type Identity struct {
	Role string // OU: webhead, patroni, router, admin, zookeeper
	Host string // CN: the host name, or a person's name for admin
	// DNSNames and IPs are the names a server answers on (SANs); empty for
	// a client-only identity.
	DNSNames []string
	IPs      []net.IP
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Validate rejects names that would make an ambiguous DN (commas, equals
// signs, quotes) or an empty one.
func (id Identity) Validate() error {
	if !nameRE.MatchString(id.Role) {
		return fmt.Errorf("pki: role %q is not a name (letters, digits, '.', '_', '-'; at most 63)", id.Role)
	}
	if !nameRE.MatchString(id.Host) {
		return fmt.Errorf("pki: host %q is not a name (letters, digits, '.', '_', '-'; at most 63)", id.Host)
	}
	return nil
}

// DN is the subject as ZooKeeper's x509 provider prints it (RFC 2253
// order: most specific first), the id an x509 ACL names.
func (id Identity) DN() string {
	return "CN=" + id.Host + ",OU=" + id.Role + ",O=" + Organization
}

func (id Identity) subject() pkix.Name {
	return pkix.Name{CommonName: id.Host, OrganizationalUnit: []string{id.Role}, Organization: []string{Organization}}
}

// CA is a certificate authority: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA makes a self-signed CA valid for the given time.
func NewCA(name string, valid time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{Organization}},
		NotBefore:             time.Now().Add(-time.Hour), // clocks of other hosts may lag
		NotAfter:              time.Now().Add(valid),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Leaf is an issued certificate with its key.
type Leaf struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Issue signs a certificate for id, usable as a TLS client and, when it
// has names, as a server.
func (ca *CA) Issue(id Identity, valid time.Duration) (*Leaf, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if len(id.DNSNames)+len(id.IPs) > 0 {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      id.subject(),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(valid),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		DNSNames:     id.DNSNames,
		IPAddresses:  id.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Leaf{Cert: cert, Key: key}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// ---------------------------------------------------------------- files

// Files names a holder's three PEM files.
type Files struct {
	CA, Cert, Key string
}

// FilesIn is the layout the dev environment writes: dir/ca.crt and
// dir/NAME.crt, dir/NAME.key.
func FilesIn(dir, name string) Files {
	return Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
}

// WriteCA writes the CA's certificate (0644) and key (0600).
func (ca *CA) Write(certFile, keyFile string) error {
	if err := writePEM(certFile, "CERTIFICATE", ca.Cert.Raw, 0o644); err != nil {
		return err
	}
	return writeKey(keyFile, ca.Key)
}

// Write writes the leaf's certificate (0644) and key (0600).
func (l *Leaf) Write(certFile, keyFile string) error {
	if err := writePEM(certFile, "CERTIFICATE", l.Cert.Raw, 0o644); err != nil {
		return err
	}
	return writeKey(keyFile, l.Key)
}

func writeKey(path string, k crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

// writePEM writes atomically: a reader never sees half a key.
func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// LoadCA reads a CA written by Write.
func LoadCA(certFile, keyFile string) (*CA, error) {
	cert, err := readCert(certFile)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("pki: %s holds no PEM key", keyFile)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", keyFile, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("pki: %s: not a signing key", keyFile)
	}
	// A rotation half done (a new key beside the old certificate) would
	// sign leaves that verify against nothing: refuse it.
	if pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("pki: %s is not the key of the first certificate in %s (a CA rotation half done? its previous key is kept beside it as .prev)", keyFile, certFile)
	}
	return &CA{Cert: cert, Key: signer}, nil
}

func readCert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("pki: %s holds no PEM certificate", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", path, err)
	}
	return c, nil
}
