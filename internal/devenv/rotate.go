package devenv

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/shardvisor/shardvisor/internal/pki"
)

// RotateTLS issues every certificate in TLSDir again (same subject and
// names, a new key and serial) and makes the servers use them, with no
// process restarted but ZooKeeper's: each file is replaced by a rename,
// so a reader sees the old file or the new one. The clients (pki.Reloader,
// libpq, kazoo) read their files at each new connection. Then:
//
//   - PostgreSQL, plain node or group member, and its PgBouncer reload
//     (SIGHUP): ssl files are read again for new connections; open ones
//     keep theirs.
//   - Patroni gets SIGHUP: 3.0.2 sees its REST certificate's serial
//     changed and opens its HTTPS listener again with the new files.
//   - ZooKeeper's quorum reloads by itself (sslQuorumReloadCertFiles), its
//     client port cannot (3.8.0): the servers restart one at a time,
//     followers first, each serving again before the next, so a quorum
//     stays and the clients' sessions move to another server.
//
// With newCA a new CA signs them; ca.crt becomes the new CA followed by
// the old one, and the servers and clients are made to trust that bundle
// before any certificate of the new CA is shown, so nothing is refused
// mid-rotation. The old CA stays in the bundle until the next rotation
// with newCA.
func (e *Env) RotateTLS(newCA bool) error {
	if !e.c.TLS {
		return fmt.Errorf("tls: the environment runs plain: nothing to rotate")
	}
	if !fileExists(e.TLSFiles("").CA) {
		return fmt.Errorf("tls: no CA in %s: run a TLS up first", e.TLSDir())
	}
	start := time.Now()
	if newCA {
		if err := e.rotateCA(); err != nil {
			return err
		}
		// The bundle first, in every server, before any new leaf shows.
		if err := e.reloadServers(); err != nil {
			return err
		}
	}
	n, err := e.reissueLeaves()
	if err != nil {
		return err
	}
	e.logf("tls: issued %d certificates again", n)
	if err := e.reloadServers(); err != nil {
		return err
	}
	e.logf("tls: rotated in %s", time.Since(start).Round(time.Millisecond))
	return nil
}

// rotateCA writes a new CA: its key to ca.key, and ca.crt as the new
// CA's certificate followed by the current one's.
func (e *Env) rotateCA() error {
	e.tlsMu.Lock()
	defer e.tlsMu.Unlock()
	caCert, caKey := filepath.Join(e.TLSDir(), "ca.crt"), filepath.Join(e.TLSDir(), "ca.key")
	old, err := os.ReadFile(caCert)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	oldFirst, _ := pem.Decode(old)
	if oldFirst == nil {
		return fmt.Errorf("tls: %s holds no PEM certificate", caCert)
	}
	ca, err := pki.NewCA("shardvisor devenv CA "+time.Now().UTC().Format("20060102T150405"), tlsValidity)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	dir, err := os.MkdirTemp(e.TLSDir(), ".ca-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := ca.Write(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")); err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	newCert, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return err
	}
	// The key first: LoadCA pairs the bundle's first certificate with it
	// (and refuses a pair that does not match: between the two renames, or
	// if the second fails). The previous key stays as ca.key.prev, and goes
	// back if the bundle cannot be written.
	oldKey, err := os.ReadFile(caKey)
	if err != nil {
		return err
	}
	if err := writeAtomic(caKey+".prev", oldKey, 0o600, nil); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(dir, "ca.key"), caKey); err != nil {
		return err
	}
	bundle := append(newCert, pem.EncodeToMemory(oldFirst)...)
	if err := writeAtomic(caCert, bundle, 0o644, nil); err != nil {
		if rerr := writeAtomic(caKey, oldKey, 0o600, nil); rerr != nil {
			return fmt.Errorf("tls: writing the CA bundle: %w; and putting the previous key back: %v (it is in %s.prev)", err, rerr, caKey)
		}
		return fmt.Errorf("tls: writing the CA bundle (the previous CA stays): %w", err)
	}
	e.logf("tls: a new CA in %s; ca.crt holds it and the previous one", e.TLSDir())
	return nil
}

// reissueLeaves issues every certificate in TLSDir but the CA's again,
// for the same subject and names, with the CA of ca.crt/ca.key; each
// key keeps its file's owner and mode.
func (e *Env) reissueLeaves() (int, error) {
	e.tlsMu.Lock()
	defer e.tlsMu.Unlock()
	dir := e.TLSDir()
	ca, err := pki.LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		return 0, fmt.Errorf("tls: the environment's CA: %w", err)
	}
	certs, err := filepath.Glob(filepath.Join(dir, "*.crt"))
	if err != nil {
		return 0, err
	}
	sort.Strings(certs)
	n := 0
	for _, certFile := range certs {
		name := strings.TrimSuffix(filepath.Base(certFile), ".crt")
		if name == "ca" {
			continue
		}
		f := e.TLSFiles(name)
		id, err := identityOf(f.Cert)
		if err != nil {
			return n, fmt.Errorf("tls: %s: %w", name, err)
		}
		leaf, err := ca.Issue(id, tlsValidity)
		if err != nil {
			return n, fmt.Errorf("tls: %s: %w", name, err)
		}
		if err := writeLeaf(f, leaf); err != nil {
			return n, fmt.Errorf("tls: %s: %w", name, err)
		}
		n++
	}
	// ZooKeeper's PEM keystores, both in one file.
	for i := 1; i <= ZKServers; i++ {
		f := e.TLSFiles("zk" + itoa(i))
		cert, err1 := os.ReadFile(f.Cert)
		key, err2 := os.ReadFile(f.Key)
		if err1 != nil || err2 != nil {
			return n, fmt.Errorf("tls: zk%d: %v %v", i, err1, err2)
		}
		if err := writeAtomic(filepath.Join(dir, "zk"+itoa(i)+".pem"), append(cert, key...), 0o600, nil); err != nil {
			return n, err
		}
	}
	return n, nil
}

// identityOf reads back the identity a certificate was issued for.
func identityOf(certFile string) (pki.Identity, error) {
	b, err := os.ReadFile(certFile)
	if err != nil {
		return pki.Identity{}, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return pki.Identity{}, fmt.Errorf("%s holds no PEM certificate", certFile)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return pki.Identity{}, err
	}
	id := pki.Identity{Host: c.Subject.CommonName, DNSNames: c.DNSNames, IPs: c.IPAddresses}
	if len(c.Subject.OrganizationalUnit) > 0 {
		id.Role = c.Subject.OrganizationalUnit[0]
	}
	return id, nil
}

// writeLeaf replaces f's key, then its certificate, each by a rename; the
// key keeps the owner and mode of the one it replaces (a PostgreSQL
// server's or a Patroni's is the postgres user's).
func writeLeaf(f pki.Files, leaf *pki.Leaf) error {
	dir, err := os.MkdirTemp(filepath.Dir(f.Cert), ".leaf-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	tc, tk := filepath.Join(dir, "c"), filepath.Join(dir, "k")
	if err := leaf.Write(tc, tk); err != nil {
		return err
	}
	key, err := os.ReadFile(tk)
	if err != nil {
		return err
	}
	cert, err := os.ReadFile(tc)
	if err != nil {
		return err
	}
	if err := writeAtomic(f.Key, key, 0o600, statOf(f.Key)); err != nil {
		return err
	}
	return writeAtomic(f.Cert, cert, 0o644, nil)
}

func statOf(path string) os.FileInfo {
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	return fi
}

// writeAtomic writes b to path by a rename of a file written beside it,
// with like's owner and mode if like is not nil.
func writeAtomic(path string, b []byte, mode os.FileMode, like os.FileInfo) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if like != nil {
		mode = like.Mode().Perm()
		if st, ok := like.Sys().(*syscall.Stat_t); ok {
			if err := os.Chown(tmp.Name(), int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
		}
	}
	if err := os.Chmod(tmp.Name(), mode); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// reloadServers makes every running server use the files as they are:
// PostgreSQL and Patroni by SIGHUP, ZooKeeper by a rolling restart.
func (e *Env) reloadServers() error {
	for i := 1; i <= e.existingNodes(); i++ {
		if err := e.pgReloadTLS(i); err != nil {
			return err
		}
	}
	return e.zkRollingRestart()
}

// pgReloadTLS reloads node i's servers: a plain node's postmaster, or
// each member's Patroni (its REST API) and postmaster.
func (e *Env) pgReloadTLS(i int) error {
	if !e.IsGroup(i) {
		if pid := e.pgPid(i); pid != 0 {
			if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
				return fmt.Errorf("pg%d: reload: %w", i, err)
			}
			e.logf("pg%d: reloaded (SIGHUP to %d)", i, pid)
		}
		return e.poolReload(e.nodePooler(i))
	}
	n, err := e.Members(i)
	if err != nil {
		return err
	}
	for m := 1; m <= n; m++ {
		for what, pid := range map[string]int{"Patroni": e.memberPatroniPid(i, m), "postgres": e.memberPGPid(i, m)} {
			if pid == 0 {
				continue
			}
			if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
				return fmt.Errorf("pg%d-m%d: reload of its %s: %w", i, m, what, err)
			}
		}
		if err := e.poolReload(e.memberPooler(i, m)); err != nil {
			return err
		}
		e.logf("pg%d-m%d: Patroni, PostgreSQL and PgBouncer reloaded (SIGHUP)", i, m)
	}
	return nil
}

// zkRollingRestart restarts the running ZooKeeper servers one at a time,
// the leader last (one election), each serving again before the next
// stops.
func (e *Env) zkRollingRestart() error {
	var order []int
	leader := 0
	// Every server serving first: with one down, restarting another would
	// take the quorum away.
	for i := 1; i <= ZKServers; i++ {
		if m := e.ZKMode(i); m != "leader" && m != "follower" {
			return fmt.Errorf("zk%d is %s: a rolling restart now would lose the quorum; start it first (scripts/devenv up)", i, m)
		}
	}
	for i := 1; i <= ZKServers; i++ {
		if e.ZKMode(i) == "leader" {
			leader = i
			continue
		}
		order = append(order, i)
	}
	if leader != 0 {
		order = append(order, leader)
	}
	for _, i := range order {
		t0 := time.Now()
		if err := e.ZKStop(i); err != nil {
			return err
		}
		if err := e.ZKStart(i); err != nil {
			return err
		}
		// ZKStart returns once a quorum runs; this one must serve too before
		// the next stops.
		for deadline := time.Now().Add(e.c.Timeout); ; time.Sleep(100 * time.Millisecond) {
			if m := e.ZKMode(i); m == "leader" || m == "follower" {
				break
			}
			if time.Now().After(deadline) {
				return withLogs(fmt.Errorf("zk%d: not serving %s after its restart with the rotated files", i, e.c.Timeout), e.zkLog(i))
			}
		}
		e.logf("zk%d: restarted with the rotated files in %s", i, time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

// CertSerial is the serial of the first certificate in a PEM file, for
// checks that a server shows the rotated one.
func CertSerial(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	blk, _ := pem.Decode(bytes.TrimSpace(b))
	if blk == nil {
		return "", fmt.Errorf("%s holds no PEM certificate", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", err
	}
	return c.SerialNumber.String(), nil
}
