package clustertest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/zksession"
)

func TestCompareEnvs(t *testing.T) {
	t.Setenv("SHARDVISOR_DEVENV_DIR", "/tmp/x-bench")
	t.Setenv("SHARDVISOR_ZK_PORT_BASE", "41811")
	t.Setenv("SHARDVISOR_PG_PORT_BASE", "41432")
	t.Setenv("SHARDVISOR_PG_NODES", "4")
	t.Setenv("SHARDVISOR_DEVENV_TLS", "1") // a comparison's plain run is plain whatever the variable
	t.Setenv("SHARDVISOR_BENCH_TLS_DIR", "")
	t.Setenv("SHARDVISOR_BENCH_TLS_ZK_PORT_BASE", "")
	t.Setenv("SHARDVISOR_BENCH_TLS_PG_PORT_BASE", "43432")
	plain, tls, err := CompareEnvs()
	if err != nil {
		t.Fatal(err)
	}
	if plain.TLS || plain.Dir != "/tmp/x-bench" || plain.ZKPortBase != 41811 || plain.PGPortBase != 41432 || plain.PGNodes != 4 {
		t.Errorf("plain: %+v", plain)
	}
	if !tls.TLS || tls.Dir != "/tmp/x-bench-tls" || tls.ZKPortBase != 41811 || tls.PGPortBase != 43432 || tls.PGNodes != 4 {
		t.Errorf("TLS: %+v", tls)
	}
	t.Setenv("SHARDVISOR_BENCH_TLS_ZK_PORT_BASE", "x")
	if _, _, err := CompareEnvs(); err == nil || !strings.Contains(err.Error(), "SHARDVISOR_BENCH_TLS_ZK_PORT_BASE") {
		t.Errorf("a bad port: %v", err)
	}
}

func TestDevTLS(t *testing.T) {
	base := zksession.Config{Connect: "127.0.0.1:1"}
	if cfg, err := DevTLS(base, t.TempDir(), false, WebHead); cfg.Dial != nil || cfg.Identity != "" || err != nil {
		t.Errorf("plain: %+v %v", cfg, err)
	}
	dir := t.TempDir()
	if _, err := DevTLS(base, dir, true, WebHead); err == nil || !strings.Contains(err.Error(), "webhead") {
		t.Errorf("TLS without the files: %v", err)
	}
	// The files as devenv lays them out in DIR/tls.
	ca, err := pki.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := pki.FilesIn(filepath.Join(dir, "tls"), WebHead)
	leaf, err := ca.Issue(pki.Identity{Role: "webhead", Host: "web1"}, time.Hour)
	if err == nil {
		err = errors.Join(os.MkdirAll(filepath.Dir(f.CA), 0o755), leaf.Write(f.Cert, f.Key), ca.Write(f.CA, filepath.Join(dir, "tls", "ca.key")))
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := DevTLS(base, dir, true, WebHead)
	if err != nil || cfg.Dial == nil || cfg.Identity != "CN=web1,OU=webhead,O=shardvisor" || cfg.Connect != base.Connect {
		t.Errorf("TLS: %+v %v", cfg, err)
	}
}
