package devenv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/internal/pki"
)

// With Config.TLS the ensemble listens for clients on TLS only
// (secureClientPort), requires a client certificate signed by the
// environment's CA, authenticates each client by its subject (x509 ACLs)
// and runs its quorum over TLS too. The environment makes its CA and every
// certificate on the first up, in Dir/tls:
//
//	ca.crt, ca.key         the dev CA (keep ca.key off other hosts in production)
//	zkI.crt/.key/.pem      ZooKeeper server I (the .pem is both, for its PEM keystore)
//	devenv.crt/.key        devenv's own client: ZooKeeper's x509 superuser
//	admin.crt/.key         the operator (shardctl as admin)
//	webhead.crt/.key       a web head, CN=web1 (the tests' client)
//	webN.crt/.key          web head N (1..3), also a server on 127.0.0.1:
//	                       the demo's supervisor N (its admin endpoints) and router
//	patroni-pgI.crt/.key   group I's Patroni (readable by the postgres user)

// devenvIdentity is devenv's own ZooKeeper client: the superuser, so that
// its cleanup deletes whatever the ACLs.
var devenvIdentity = pki.Identity{Role: "admin", Host: "devenv"}

// tlsValidity: a dev environment lives days, not years.
const tlsValidity = 90 * 24 * time.Hour

// WebHeads is how many web head identities the environment issues
// (webN), one per supervisor of the demo's fleet.
const WebHeads = 3

// WebHead is web head n's identity: a client of ZooKeeper and, for its
// supervisor's admin endpoints, a server on 127.0.0.1.
func WebHead(n int) pki.Identity {
	return pki.Identity{Role: "webhead", Host: "web" + itoa(n), DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
}

// TLSDir holds the environment's CA and certificates.
func (e *Env) TLSDir() string { return filepath.Join(e.c.Dir, "tls") }

// TLSFiles are the files of one identity in TLSDir ("admin", "webhead",
// "devenv", "zk1", "patroni-pg1").
func (e *Env) TLSFiles(name string) pki.Files { return pki.FilesIn(e.TLSDir(), name) }

// TLSIdentities are the identities the environment issues besides its
// servers', by file name.
func (e *Env) tlsIdentities() map[string]pki.Identity {
	ids := map[string]pki.Identity{
		"devenv":  devenvIdentity,
		"admin":   {Role: "admin", Host: "operator"},
		"webhead": {Role: "webhead", Host: "web1"},
	}
	// On hosts of their own (Config.Hosts) the servers' certificates name
	// their hosts' addresses too: clients verify them.
	for n := 1; n <= WebHeads; n++ {
		id := WebHead(n)
		id.IPs = e.serverIPs("web" + itoa(n))
		ids["web"+itoa(n)] = id
	}
	for i := 1; i <= ZKServers; i++ {
		ids["zk"+itoa(i)] = pki.Identity{Role: "zookeeper", Host: "zk" + itoa(i), DNSNames: []string{"localhost"}, IPs: e.serverIPs("zk" + itoa(i))}
	}
	for i := 1; i <= 9; i++ {
		id := patroniIdentity(i)
		for m := 1; m <= MaxMembers && e.c.Hosts != nil; m++ {
			if a := e.c.Hosts.Addr(MemberName(i, m)); a != "" {
				id.IPs = append(id.IPs, net.ParseIP(a))
			}
		}
		ids["patroni-pg"+itoa(i)] = id
	}
	return ids
}

// patroniIdentity is group i's Patroni: the only writer of its records.
// It also serves the members' REST APIs, on 127.0.0.1.
func patroniIdentity(i int) pki.Identity {
	return pki.Identity{Role: "patroni", Host: "pg" + itoa(i), DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
}

// patroniReaders are the identities Patroni's set_acls lets read a
// group's records. Patroni 3.0.2 writes only x509 entries there, so there
// is no world:anyone read: every reader is named.
func patroniReaders() []string {
	r := []string{pki.Identity{Role: "admin", Host: "operator"}.DN()}
	for n := 1; n <= WebHeads; n++ {
		r = append(r, WebHead(n).DN())
	}
	return r
}

// scopeACL is the ACL of group i's scope, as its Patroni's set_acls gives
// every znode under it.
func scopeACL(i int) []zk.ACL {
	acl := []zk.ACL{{Perms: zk.PermAll, Scheme: "x509", ID: patroniIdentity(i).DN()}}
	for _, r := range patroniReaders() {
		acl = append(acl, zk.ACL{Perms: zk.PermRead, Scheme: "x509", ID: r})
	}
	return acl
}

// ensureScope gives Patroni's namespace and group i's scope the mode's
// ACLs. With TLS the namespace is readable by anyone and writable by the
// superuser only, and the scope is created with scopeACL before its
// Patroni starts: any create permission on the namespace would let one db
// host take another group's name before that group exists, and ZooKeeper
// cannot grant the creation of one child only, so the admin (here devenv)
// creates every scope. Nodes a plain run of the group left under the
// scope (its config, history, status) get scopeACL too: Patroni sets ACLs
// only on what it creates. Plain, a TLS run's ACLs are reset to anyone
// ALL: a plain Patroni has no identity (devenv's plain client is the
// digest superuser: zkConnected).
func (e *Env) ensureScope(i int) error {
	c, err := e.zkConnected(15 * time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	ns := strings.TrimSuffix(PatroniNamespace, "/")
	nsACL, scope := zk.WorldACL(zk.PermAll), zk.WorldACL(zk.PermAll)
	if e.c.TLS {
		nsACL, scope = zk.WorldACL(zk.PermRead), scopeACL(i)
		// The namespace first: its child's create needs it.
		if _, err := c.Create(ns, nil, 0, nsACL); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
		if _, err := c.Create(ns+"/pg"+itoa(i), nil, 0, scope); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	if err := setACL(c, ns, nsACL, false); err != nil {
		return err
	}
	return setACL(c, ns+"/pg"+itoa(i), scope, true)
}

// ensureTLS makes the CA and the certificates that are missing. A CA that
// exists is kept, so clients holding its certificate keep trusting the
// servers across restarts.
func (e *Env) ensureTLS() error {
	e.tlsMu.Lock()
	defer e.tlsMu.Unlock()
	dir := e.TLSDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	caCert, caKey := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	ca, err := pki.LoadCA(caCert, caKey)
	if os.IsNotExist(err) {
		if ca, err = pki.NewCA("shardvisor devenv CA", tlsValidity); err == nil {
			err = ca.Write(caCert, caKey)
		}
		if err == nil {
			e.logf("tls: made a CA in %s", dir)
		}
	}
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	for name, id := range e.tlsIdentities() {
		f := e.TLSFiles(name)
		if _, err := os.Stat(f.Key); err == nil {
			continue
		}
		leaf, err := ca.Issue(id, tlsValidity)
		if err == nil {
			err = leaf.Write(f.Cert, f.Key)
		}
		if err != nil {
			return fmt.Errorf("tls: %s: %w", name, err)
		}
	}
	// ZooKeeper's PEM keystore wants the certificate and key in one file;
	// Patroni runs as postgres and reads its own key.
	for i := 1; i <= ZKServers; i++ {
		f := e.TLSFiles("zk" + itoa(i))
		cert, err1 := os.ReadFile(f.Cert)
		key, err2 := os.ReadFile(f.Key)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("tls: zk%d: %v %v", i, err1, err2)
		}
		// Only when it differs, and by a rename: the running servers
		// watch it (sslQuorumReloadCertFiles), and one reading it while
		// it was rewritten in place at another's start failed ("did not
		// find a private key").
		pemFile, both := filepath.Join(dir, "zk"+itoa(i)+".pem"), append(cert, key...)
		if b, err := os.ReadFile(pemFile); err == nil && bytes.Equal(b, both) {
			continue
		}
		if err := writeAtomic(pemFile, both, 0o600, nil); err != nil {
			return err
		}
	}
	for i := 1; i <= 9; i++ {
		if err := chownPG(e.TLSFiles("patroni-pg" + itoa(i)).Key); err != nil {
			return err
		}
	}
	return nil
}

// zkDial is how devenv's own clients reach a server: plain TCP, or TLS as
// the devenv identity (ZooKeeper's superuser) when the ensemble is TLS.
func (e *Env) zkDial() (func(network, addr string, timeout time.Duration) (net.Conn, error), error) {
	if !e.c.TLS {
		return net.DialTimeout, nil
	}
	cfg, err := e.TLSFiles("devenv").Config()
	if err != nil {
		return nil, err
	}
	return pki.Dialer(cfg), nil
}

// fourLetter sends a four-letter word to server i over the client
// transport the ensemble uses.
func (e *Env) fourLetter(i int, word string, timeout time.Duration) (string, error) {
	dial, err := e.zkDial()
	if err != nil {
		return "", err
	}
	return fourLetterWith(dial, e.hostPort("zk"+itoa(i), e.ZKPort(i)), word, timeout)
}

func fourLetterWith(dial func(network, addr string, timeout time.Duration) (net.Conn, error), addr, word string, timeout time.Duration) (string, error) {
	c, err := dial("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, word); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	if err != nil && len(b) > 0 {
		err = nil // over TLS the server closes without close_notify once it has answered
	}
	return string(b), err
}
