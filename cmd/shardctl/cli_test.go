package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// Exit statuses and flag placement of the binary: flags (the command's and
// the global ones) may come after arguments and between command names; a
// flag that is unknown, lacks its value or is required and missing is a
// usage error (2); a command that runs and fails exits 1.
func TestIntegrationExitStatusAndFlagPlacement(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	root := z.Root + "/cli" // no cluster here: commands that reach it fail with 1
	for _, tc := range []struct {
		args   []string
		code   int
		errHas string
	}{
		{[]string{"assign", "3", "n2", "--bogus"}, 2, "usage error: flag provided but not defined: -bogus"},
		{[]string{"table", "add", "app.x"}, 2, `usage error: Required flag "key" not set`},
		{[]string{"table", "add"}, 2, `usage error: Required flag "key" not set`},
		{[]string{"hash", "alice", "--level"}, 2, "usage error: flag needs an argument: -level"},
		{[]string{"status", "--zk"}, 2, "usage error: flag needs an argument: -zk"},
		{[]string{"node", "bogus"}, 2, `unknown command "bogus"`},
		{[]string{"status", "--zk-root", root}, 1, "error: cluster does not exist"},
		// Without --no-copy assign is a usage error, so exit 1 shows that
		// the flags after the arguments were read.
		{[]string{"assign", "3", "n2", "--no-copy", "--zk-root", root}, 1, "error: cluster does not exist"},
		{[]string{"assign", "--no-copy", "3", "--zk-root", root, "n2", "--force"}, 1, "error: cluster does not exist"},
		{[]string{"move", "5", "--to", "n2", "--zk-root=" + root}, 1, "error: cluster does not exist"},
		{[]string{"move", "--to", "n2", "5", "--zk-root", root}, 1, "error: cluster does not exist"},
		{[]string{"node", "--zk-root", root, "check", "pg1"}, 1, "error: cluster does not exist"},
		{[]string{"table", "add", "app.x", "--zk-root", root, "--key", "k"}, 1, "error: table add app.x: cluster does not exist"},
	} {
		r := run(t, "", append([]string{"--zk", z.ConnectString}, tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, "shardctl: "+tc.errHas) {
			t.Errorf("shardctl %v: exit %d, stderr %q; want %d with %q", tc.args, r.code, r.stderr, tc.code, tc.errHas)
		}
	}
}

// Variables named after the command path reach their flags (the names are
// pinned by testdata/env.txt).
func TestIntegrationEnvironmentVariables(t *testing.T) {
	z := testenv.StartZK(t)
	t.Setenv("SHARDVISOR_ZK", z.ConnectString)
	t.Setenv("SHARDVISOR_ZK_ROOT", z.Root+"/cli")
	if r := runData(t, "assign", "3", "n2"); r.code != 2 || !strings.Contains(r.stderr, "without --no-copy") {
		t.Fatalf("assign without --no-copy: exit %d, %q", r.code, r.stderr)
	}
	t.Setenv("SHARDVISOR_ASSIGN_NO_COPY", "true")
	if r := runData(t, "assign", "3", "n2"); r.code != 1 || !strings.Contains(r.stderr, "cluster does not exist: no bucket map at "+z.Root+"/cli/") {
		t.Fatalf("SHARDVISOR_ASSIGN_NO_COPY: exit %d, %q", r.code, r.stderr)
	}
	t.Setenv("SHARDVISOR_GC_BATCH", "0")
	if r := runData(t, "gc"); r.code != 2 || !strings.Contains(r.stderr, "--batch must be at least 1") {
		t.Fatalf("SHARDVISOR_GC_BATCH: exit %d, %q", r.code, r.stderr)
	}
}

// --windows takes close or wait, refused before anything is read.
func TestSchemaApplyWindowsFlag(t *testing.T) {
	if r := runData(t, "schema", "apply", "--windows", "later", "no-such.sql"); r.code != 2 || !strings.Contains(r.stderr, `--windows must be close or wait, not "later"`) {
		t.Fatalf("--windows later: exit %d, %q", r.code, r.stderr)
	}
}

// --metrics-addr of node reconcile serves --watch's metrics only: once,
// it is refused before anything is read.
func TestReconcileMetricsAddrNeedsWatch(t *testing.T) {
	if r := runData(t, "node", "reconcile", "--metrics-addr", "127.0.0.1:0"); r.code != 2 || !strings.Contains(r.stderr, "--metrics-addr serves the metrics of --watch only") {
		t.Fatalf("exit %d, %q", r.code, r.stderr)
	}
}

// Every flag of every command can be set from the environment, under the
// names pinned in testdata/env.txt.
func TestEveryFlagHasAnEnvironmentVariable(t *testing.T) {
	cliutil.CheckEnv(t, newApp(), "testdata/env.txt")
}

// No command ignores an argument: one more than its ArgsUsage names (any
// for a command that names none) is a usage error, before anything is
// connected or changed (`shardctl split 0` split every bucket).
func TestEveryCommandRefusesExtraArguments(t *testing.T) {
	var check func(path []string, cmds []*cli.Command)
	n := 0
	check = func(path []string, cmds []*cli.Command) {
		for _, c := range cmds {
			p := append(path[:len(path):len(path)], c.Name)
			check(p, c.Subcommands)
			if c.Action == nil {
				continue
			}
			max, unlimited := cliutil.MaxArgs(c.ArgsUsage)
			if unlimited {
				continue
			}
			args := append([]string{}, p...)
			if c.Name == "add" && len(p) == 2 && p[0] == "table" {
				args = append(args, "--key", "k") // its required flag
			}
			for i := 0; i <= max; i++ {
				args = append(args, fmt.Sprintf("extra%d", i))
			}
			var out, errb bytes.Buffer
			app := newApp()
			app.Writer, app.ErrWriter = &out, &errb
			code := cliutil.Exec(context.Background(), app, append([]string{"shardctl", "--zk", "127.0.0.1:1"}, args...))
			if code != cliutil.ExitUsage || !strings.Contains(errb.String(), "argument") || !strings.Contains(errb.String(), fmt.Sprintf("extra%d", max)) {
				t.Errorf("shardctl %s: exit %d, %q; want a usage error about the extra argument", strings.Join(args, " "), code, errb.String())
			}
			n++
		}
	}
	check(nil, newApp().Commands)
	if n < 30 {
		t.Fatalf("only %d commands checked", n)
	}
}
