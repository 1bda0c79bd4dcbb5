package pki

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"time"
)

// Config loads f into a TLS configuration that presents f's certificate and
// trusts only f's CA, for both directions: as a client it checks the
// server's name (set per connection, Dialer), as a server it requires and
// checks the client's certificate.
func (f Files) Config() (*tls.Config, error) {
	if f.CA == "" || f.Cert == "" || f.Key == "" {
		return nil, fmt.Errorf("pki: TLS needs a CA, a certificate and a key file (got CA %q, cert %q, key %q)", f.CA, f.Cert, f.Key)
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("pki: reading the CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("pki: %s holds no PEM certificate", f.CA)
	}
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: loading %s and %s: %w", f.Cert, f.Key, err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}, nil
}

// SubjectDN is the subject of f's certificate as ZooKeeper's x509
// provider names it in ACLs (RFC 2253, most specific first): the
// identity a session dialled with f authenticates as.
func (f Files) SubjectDN() (string, error) {
	c, err := readCert(f.Cert)
	if err != nil {
		return "", err
	}
	return c.Subject.ToRDNSequence().String(), nil
}

// Dialer dials TCP then TLS, checking the server's certificate against the
// host of each address dialled (ZooKeeper lists several servers; each
// must prove it is the one named). The handshake shares the dial timeout.
func Dialer(base *tls.Config) func(network, addr string, timeout time.Duration) (net.Conn, error) {
	return dialer(func(host string) *tls.Config {
		cfg := base.Clone()
		cfg.ServerName = host
		return cfg
	})
}

// dialer dials TCP then TLS with the configuration configFor gives the
// host dialled.
func dialer(configFor func(host string) *tls.Config) func(network, addr string, timeout time.Duration) (net.Conn, error) {
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		cfg := configFor(host)
		d := &net.Dialer{Timeout: timeout}
		raw, err := d.Dial(network, addr)
		if err != nil {
			return nil, err
		}
		c := tls.Client(raw, cfg)
		_ = c.SetDeadline(time.Now().Add(timeout))
		if err := c.Handshake(); err != nil {
			raw.Close()
			return nil, fmt.Errorf("TLS with %s: %w", addr, err)
		}
		_ = c.SetDeadline(time.Time{})
		return c, nil
	}
}

// Peer is the identity a verified TLS peer presented, or false.
func Peer(cs tls.ConnectionState) (Identity, bool) {
	if len(cs.VerifiedChains) == 0 || len(cs.PeerCertificates) == 0 {
		return Identity{}, false
	}
	c := cs.PeerCertificates[0]
	if len(c.Subject.OrganizationalUnit) != 1 || len(c.Subject.Organization) != 1 || c.Subject.Organization[0] != Organization {
		return Identity{}, false
	}
	id := Identity{Role: c.Subject.OrganizationalUnit[0], Host: c.Subject.CommonName}
	return id, id.Validate() == nil
}
