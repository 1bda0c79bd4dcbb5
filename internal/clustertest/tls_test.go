package clustertest

import (
	"strings"
	"testing"
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

func TestDevDial(t *testing.T) {
	if d, err := DevDial(t.TempDir(), false, WebHead); d != nil || err != nil {
		t.Errorf("plain: %v %v", d, err)
	}
	if _, err := DevDial(t.TempDir(), true, WebHead); err == nil || !strings.Contains(err.Error(), "webhead") {
		t.Errorf("TLS without the files: %v", err)
	}
}
