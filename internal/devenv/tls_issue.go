package devenv

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/shardvisor/shardvisor/internal/pki"
)

// IssueIdentity writes a certificate of the environment's CA for id into
// TLSDir as name.crt/.key (kept if it exists), for a host the
// environment does not issue itself: a second web head, a test's
// attacker. The CA must exist (the first TLS up makes it).
func (e *Env) IssueIdentity(name string, id pki.Identity) (pki.Files, error) {
	e.tlsMu.Lock()
	defer e.tlsMu.Unlock()
	f := e.TLSFiles(name)
	if _, err := os.Stat(f.Key); err == nil {
		return f, nil
	}
	ca, err := pki.LoadCA(filepath.Join(e.TLSDir(), "ca.crt"), filepath.Join(e.TLSDir(), "ca.key"))
	if err != nil {
		return f, fmt.Errorf("tls: the environment's CA: %w", err)
	}
	leaf, err := ca.Issue(id, tlsValidity)
	if err == nil {
		err = leaf.Write(f.Cert, f.Key)
	}
	if err != nil {
		return f, fmt.Errorf("tls: %s: %w", name, err)
	}
	return f, nil
}
