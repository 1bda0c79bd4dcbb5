package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/topo"
)

func TestHelpFlagsAndUsage(t *testing.T) {
	bin, _ := binaries(t) // the upgrade tests' build, once per test process
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v\n%s", err, out)
	}
	// Every flag has an environment variable (except --help and --version).
	flagLine := regexp.MustCompile(`^\s+--[a-z]`)
	for _, line := range strings.Split(string(out), "\n") {
		if flagLine.MatchString(line) && !strings.Contains(line, "--help") && !strings.Contains(line, "--version") && !strings.Contains(line, "[$") {
			t.Errorf("flag without an environment variable: %s", strings.TrimSpace(line))
		}
	}
	for _, want := range []string{"--config", "--pool", "--admin", "--holddown", "--debounce", "--state-dir", "SHARDVISOR_ZK"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--help lacks %s", want)
		}
	}
	cmd := exec.Command(bin, "--config", "/x.json", "extra")
	if err := cmd.Run(); cmd.ProcessState.ExitCode() != 2 {
		t.Errorf("stray argument: exit %d (%v), want 2", cmd.ProcessState.ExitCode(), err)
	}
	cmd = exec.Command(bin, "--config", "/x.json", "--pool", "Bad Name")
	if err := cmd.Run(); cmd.ProcessState.ExitCode() != 2 {
		t.Errorf("bad pool name: exit %d (%v), want 2", cmd.ProcessState.ExitCode(), err)
	}
	// Nonsense values are usage errors naming the flag, before anything
	// starts.
	cfg := filepath.Join(t.TempDir(), "pool.json")
	if err := os.WriteFile(cfg, []byte(exampleConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(short, []byte("abcde\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", cfg, "--debounce", "-1s"}, "--debounce must not be negative"},
		{[]string{"--config", cfg, "--holddown", "-3s"}, "--holddown must not be negative"},
		{[]string{"--config", cfg, "--config-poll", "0s"}, "--config-poll must be a positive duration"},
		{[]string{"--pool", "web", "--zk-session-timeout", "0s"}, "--zk-session-timeout must be a positive duration"},
		{[]string{"--pool", "web", "--zk-timeout", "-1s"}, "--zk-timeout must be a positive duration"},
		{[]string{"--config", cfg, "--zk", "127.0.0.1:2181"}, "give --config or --zk, not both"},
		{[]string{"--config", filepath.Join(t.TempDir(), "missing.json")}, "config file: stat"},
		{[]string{"--config", cfg, "--peer-refresh", "0s"}, "--peer-refresh must be a positive duration"},
		{[]string{"--config", cfg, "--peer-secret-file", filepath.Join(t.TempDir(), "nope")}, "--peer-secret-file: open"},
		{[]string{"--config", cfg, "--peer-secret-file", short}, "holds 5 bytes of secret, want at least 16"},
	} {
		// A value let through would start a supervisor: bound it.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, tc.args...)
		cmd.Env = append(os.Environ(), "SHARDVISOR_ADMIN_ADDR=127.0.0.1:0")
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("%q: exit %d, %s; want exit 2 saying %q", tc.args, cmd.ProcessState.ExitCode(), out, tc.want)
		}
	}
	// The shim refuses to run nothing.
	cmd = exec.Command(bin, "__exec-shim")
	if err := cmd.Run(); cmd.ProcessState.ExitCode() != 127 {
		t.Errorf("empty shim: exit %d (%v), want 127", cmd.ProcessState.ExitCode(), err)
	}
}

func TestExampleConfigIsValid(t *testing.T) {
	if _, err := topo.DecodePoolConfig("example-config.json", []byte(exampleConfig)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../../examples/hello/pool.json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topo.DecodePoolConfig("examples/hello/pool.json", b); err != nil {
		t.Fatal(err)
	}
}

// Every flag of every command can be set from the environment, under the
// names pinned in testdata/env.txt.
func TestEveryFlagHasAnEnvironmentVariable(t *testing.T) {
	cliutil.CheckEnv(t, app(), "testdata/env.txt")
}
