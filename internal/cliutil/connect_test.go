package cliutil

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/pki"
)

// connectErr runs Connect with args against a port nothing answers on.
func connectErr(t *testing.T, args ...string) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody listens there now
	var got error
	app := &cli.App{Flags: ZKFlags(), Action: func(c *cli.Context) error {
		s, _, err := Connect(c, zap.NewNop())
		if s != nil {
			s.Close()
		}
		got = err
		return nil
	}}
	argv := append([]string{"t", "--zk", addr, "--zk-timeout", "200ms", "--zk-session-timeout", "400ms"}, args...)
	if err := app.RunContext(context.Background(), argv); err != nil {
		t.Fatal(err)
	}
	if got == nil {
		t.Fatal("Connect succeeded with nothing listening")
	}
	return got
}

// A session that never comes says what to check, and names the TLS flags
// when none were given: a TLS-only ensemble closes a plain connection, and
// the library's own log says only "authentication failed: EOF".
func TestConnectFailureHint(t *testing.T) {
	h := hint.Of(connectErr(t))
	if !strings.Contains(h, "scripts/devenv status") || !strings.Contains(h, "--zk-tls-ca") {
		t.Errorf("hint without TLS flags = %q", h)
	}
	dir := t.TempDir()
	ca, err := pki.NewCA("t", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.Identity{Role: "admin", Host: "t"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := pki.FilesIn(dir, "t")
	if err := ca.Write(f.CA, filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	if err := leaf.Write(f.Cert, f.Key); err != nil {
		t.Fatal(err)
	}
	h = hint.Of(connectErr(t, "--zk-tls-ca", f.CA, "--zk-tls-cert", f.Cert, "--zk-tls-key", f.Key))
	if !strings.Contains(h, "scripts/devenv status") || strings.Contains(h, "--zk-tls-ca") {
		t.Errorf("hint with TLS flags = %q", h)
	}
}
