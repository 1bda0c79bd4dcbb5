package devenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Patroni's REST API. Plain, it is HTTP for anyone: PATCH /config and
// POST /restart included. With Config.TLS it is HTTPS with a required
// client certificate of the environment's CA (verify_client: required),
// and the unsafe methods also need basic auth with a password only the
// members and operators hold (APIPasswordFile): a web head's certificate
// is of the same CA, and Patroni cannot tell certificates apart.

// patroniAPI is devenv's client of the members' REST APIs.
type patroniAPI struct {
	client *http.Client
	scheme string
	user   string // basic auth on every request when set
	pw     string
}

// apiEndpoint is one member's REST API.
type apiEndpoint struct {
	addr string
	port int
	c    *patroniAPI
}

// PatroniAPIUser is the basic-auth user of the members' REST APIs.
const PatroniAPIUser = "patroni"

// APIPasswordFile holds the REST API's basic-auth password (TLS mode).
func (e *Env) APIPasswordFile() string { return filepath.Join(e.TLSDir(), "patroni-api.pass") }

// ensureAPIPassword makes the REST API's password once.
func (e *Env) ensureAPIPassword() (string, error) {
	if b, err := os.ReadFile(e.APIPasswordFile()); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	pw := randomPassword()
	if err := os.MkdirAll(e.TLSDir(), 0o755); err != nil {
		return "", err
	}
	return pw, os.WriteFile(e.APIPasswordFile(), []byte(pw+"\n"), 0o600)
}

// patroniAPI builds the client once per Env: HTTP, or HTTPS as devenv's
// identity with the API password, its CA and certificate read again when
// they change (a rotation, RotateTLS, needs no new Env). A TLS
// environment whose files are unreadable gets a client that fails every
// request (health says "not answering", with the path in the log of up).
func (e *Env) patroniAPI() *patroniAPI {
	e.apiOnce.Do(func() {
		e.api = &patroniAPI{client: &http.Client{Timeout: 1500 * time.Millisecond}, scheme: "http"}
		if !e.c.TLS {
			return
		}
		e.api.scheme = "https"
		_, clientFor, err := e.TLSFiles("devenv").Reloading()
		pw, err2 := e.ensureAPIPassword()
		if err != nil || err2 != nil {
			e.logf("Patroni REST API client: %v %v", err, err2)
			clientFor = func(string) *tls.Config {
				return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool(), ServerName: "invalid."}
			}
		}
		// Each member is checked against its own address (the URL's host).
		e.api.client.Transport = &http.Transport{DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			d := tls.Dialer{Config: clientFor(host)}
			return d.DialContext(ctx, network, addr)
		}}
		e.api.user, e.api.pw = PatroniAPIUser, pw
	})
	return e.api
}

func (a *patroniAPI) request(method, addr string, port int, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequest(method, a.scheme+"://"+net.JoinHostPort(addr, strconv.Itoa(port))+path, body)
	if err == nil && a.user != "" {
		req.SetBasicAuth(a.user, a.pw)
	}
	return req, err
}
