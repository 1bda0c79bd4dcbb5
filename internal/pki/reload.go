package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// Reloader reads a CA bundle and a client certificate and key from their
// files, and again whenever one of them changes on disk (size or
// modification time, looked at on each use): a certificate rotated by
// replacing its files is used by the next handshake, with no restart.
// Connections already made keep what they were made with.
type Reloader struct {
	ca, cert, key string // "" for none

	mu     sync.Mutex
	loaded bool // a set loaded once: roots and pair are good
	stamp  [3]fileStamp
	roots  *x509.CertPool
	pair   *tls.Certificate
	err    error
}

type fileStamp struct {
	size int64
	mod  time.Time
}

// NewReloader loads the files now (an error names the one that failed).
// ca may be "" (no verification against a CA of its own), and cert and
// key both "" (no client certificate).
func NewReloader(ca, cert, key string) (*Reloader, error) {
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("pki: a client certificate needs both its certificate and its key file (got %q and %q)", cert, key)
	}
	r := &Reloader{ca: ca, cert: cert, key: key}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.refresh(); err != nil {
		return nil, err
	}
	return r, nil
}

// refresh reloads what changed since the last load; on an error (a file
// half-written, say) it keeps the last good set and reports the error
// until the files load again.
func (r *Reloader) refresh() error {
	var now [3]fileStamp
	for i, p := range []string{r.ca, r.cert, r.key} {
		if p == "" {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil {
			return r.keep(fmt.Errorf("pki: %w", err))
		}
		now[i] = fileStamp{fi.Size(), fi.ModTime()}
	}
	if r.loaded && r.err == nil && now == r.stamp {
		return nil
	}
	var roots *x509.CertPool
	if r.ca != "" {
		b, err := os.ReadFile(r.ca)
		if err != nil {
			return r.keep(fmt.Errorf("pki: reading the CA: %w", err))
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(b) {
			return r.keep(fmt.Errorf("pki: %s holds no PEM certificate", r.ca))
		}
	}
	var pair *tls.Certificate
	if r.cert != "" {
		p, err := tls.LoadX509KeyPair(r.cert, r.key)
		if err != nil {
			return r.keep(fmt.Errorf("pki: loading %s and %s: %w", r.cert, r.key, err))
		}
		pair = &p
	}
	r.stamp, r.roots, r.pair, r.err, r.loaded = now, roots, pair, nil, true
	return nil
}

// keep records err; the last good set stays in use if there is one.
func (r *Reloader) keep(err error) error {
	r.err = err
	if r.loaded {
		return nil
	}
	return err
}

func (r *Reloader) current() (*x509.CertPool, *tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.refresh(); err != nil {
		return nil, nil, err
	}
	return r.roots, r.pair, nil
}

// Verify says how a client checks the server's certificate.
type Verify int

const (
	// VerifyNone: encrypted, the server unchecked (libpq's require
	// without a root certificate).
	VerifyNone Verify = iota
	// VerifyCA: the chain up to the CA, not the name.
	VerifyCA
	// VerifyFull: the chain and the name dialled.
	VerifyFull
)

// ClientConfig returns a copy of base whose server check (against the
// CA, as of each handshake) and client certificate (likewise) come from
// r. base's ServerName is the name checked with VerifyFull.
func (r *Reloader) ClientConfig(base *tls.Config, v Verify) *tls.Config {
	c := base.Clone()
	c.InsecureSkipVerify = true // checked below, against the current roots
	c.RootCAs = nil
	c.VerifyPeerCertificate = nil
	name := c.ServerName // IP literals never reach the handshake's own state (no SNI)
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if v == VerifyNone {
			return nil
		}
		roots, _, err := r.current()
		if err != nil {
			return err
		}
		if roots == nil {
			return errors.New("pki: no CA to verify the server against")
		}
		if len(cs.PeerCertificates) == 0 {
			return errors.New("pki: the server presented no certificate")
		}
		opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
		for _, ic := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(ic)
		}
		if v == VerifyFull {
			// Never an empty name: x509 would skip the check.
			if opts.DNSName = name; name == "" {
				if opts.DNSName = cs.ServerName; cs.ServerName == "" {
					return errors.New("pki: no server name to verify the certificate against")
				}
			}
		}
		_, err = cs.PeerCertificates[0].Verify(opts)
		return err
	}
	if r.cert != "" {
		c.Certificates = nil
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			_, pair, err := r.current()
			if err != nil {
				return nil, err
			}
			return pair, nil
		}
	}
	return c
}

// ReloadingDialer is Dialer with f's files read again when they change
// (Reloader): each dial checks the server's certificate against the CA
// and name as of that dial, and presents the client certificate as of
// then.
func (f Files) ReloadingDialer() (func(network, addr string, timeout time.Duration) (net.Conn, error), error) {
	_, clientFor, err := f.Reloading()
	if err != nil {
		return nil, err
	}
	return dialer(clientFor), nil
}

// Reloading returns, from one Reloader of f, a server configuration (its
// certificate, client certificates of its CA required) and the client
// configuration for a host (the server's certificate checked against the
// CA and that name), all reading the files again when they change: a
// rotation needs no restart.
func (f Files) Reloading() (server *tls.Config, clientFor func(host string) *tls.Config, err error) {
	if f.CA == "" || f.Cert == "" || f.Key == "" {
		return nil, nil, fmt.Errorf("pki: TLS needs a CA, a certificate and a key file (got CA %q, cert %q, key %q)", f.CA, f.Cert, f.Key)
	}
	r, err := NewReloader(f.CA, f.Cert, f.Key)
	if err != nil {
		return nil, nil, err
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	clientFor = func(host string) *tls.Config {
		b := base.Clone()
		b.ServerName = host
		return r.ClientConfig(b, VerifyFull)
	}
	return r.ServerConfig(base), clientFor, nil
}

// ServerConfig returns a copy of base that presents r's certificate and
// takes only client certificates of r's CA, both as of each handshake.
func (r *Reloader) ServerConfig(base *tls.Config) *tls.Config {
	c := base.Clone()
	c.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		roots, pair, err := r.current()
		if err != nil {
			return nil, err
		}
		if pair == nil || roots == nil {
			return nil, errors.New("pki: a server needs a certificate and a CA for its clients")
		}
		cc := base.Clone()
		cc.Certificates = []tls.Certificate{*pair}
		cc.ClientCAs = roots
		cc.ClientAuth = tls.RequireAndVerifyClientCert
		return cc, nil
	}
	return c
}

// ReloadingServerConfig is the server half of Reloading.
func (f Files) ReloadingServerConfig() (*tls.Config, error) {
	server, _, err := f.Reloading()
	return server, err
}
