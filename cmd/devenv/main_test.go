package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/internal/cliutil"
)

// Every flag can be set from the environment, under the names
// scripts/devenv has always read (testdata/env.txt).
func TestEveryFlagHasAnEnvironmentVariable(t *testing.T) {
	cliutil.CheckEnv(t, newApp(), "testdata/env.txt")
}

// Usage errors exit 2, failures 1, with the script's messages; env prints
// the export lines scripts evaluate, with no server running.
func TestCommands(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("SHARDVISOR_DEVENV_DIR", dir)
	t.Setenv("SHARDVISOR_ZK_PORT_BASE", "7811")
	t.Setenv("SHARDVISOR_PG_PORT_BASE", "7432")
	// make test runs under scripts/with-devenv, which pins the plain mode
	// in the environment: these cases name the mode themselves.
	for _, v := range []string{"SHARDVISOR_DEVENV_TLS", "SHARDVISOR_DEVENV_PLAIN"} {
		if old, ok := os.LookupEnv(v); ok {
			os.Unsetenv(v)
			t.Cleanup(func() { os.Setenv(v, old) })
		}
	}
	if err := os.MkdirAll(dir+"/pg", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/pg/password", []byte("pw\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// pgBackRest on the environment's repository: as root, as the postgres
	// user.
	pgbr := "export SHARDVISOR_PGBACKREST_CONFIG='" + dir + "/backup/pgbackrest.conf'\n" +
		"export SHARDVISOR_PGBACKREST='/usr/bin/pgbackrest'\n"
	if os.Geteuid() == 0 {
		pgbr = "export SHARDVISOR_PGBACKREST_CONFIG='" + dir + "/backup/pgbackrest.conf'\n" +
			"export SHARDVISOR_PGBACKREST='/usr/sbin/runuser -u postgres -- /usr/bin/pgbackrest'\n"
	}
	for _, tc := range []struct {
		args        []string
		code        int
		out, errHas string
	}{
		{[]string{"--bogus"}, 2, "", "devenv: usage error: flag provided but not defined: -bogus"},
		{[]string{"pg-kill", "x"}, 1, "", "devenv: error: expected a node number, got 'x'"},
		{[]string{"zk-kill", "4"}, 1, "", "devenv: error: no ZooKeeper server 4"},
		{[]string{"zk-cut", "1", "1"}, 1, "", "devenv: error: pg1 is not a Patroni group"},
		{[]string{"pg-primary", "2"}, 1, "", "devenv: error: pg2 is not a Patroni group"},
		{[]string{"logs", "zz"}, 1, "", "devenv: error: unknown server 'zz'"},
		{[]string{"--pg-nodes", "0", "env"}, 1, "", "devenv: error: SHARDVISOR_PG_NODES must be a positive integer, got '0'"},
		{[]string{"run"}, 2, "", "devenv: usage error: run needs a command"},
		{[]string{"--plain", "--tls", "env"}, 2, "", "devenv: usage error: --plain and --tls"},
		// TLS is the default: env names the admin's files, and the DSNs verify
		// the servers against the environment's CA.
		{[]string{"env", "--pg-nodes", "1"}, 0, "export SHARDVISOR_ZK='127.0.0.1:7811,127.0.0.1:7812,127.0.0.1:7813'\n" +
			"export SHARDVISOR_ZK_TLS_CA='" + dir + "/tls/ca.crt'\n" +
			"export SHARDVISOR_ZK_TLS_CERT='" + dir + "/tls/admin.crt'\n" +
			"export SHARDVISOR_ZK_TLS_KEY='" + dir + "/tls/admin.key'\n" +
			"export SHARDVISOR_PG_PASSWORD_FILE='" + dir + "/pg/password'\n" +
			"export PGPASSFILE='" + dir + "/pg/pgpass'\n" +
			"export SHARDVISOR_PG1_DSN='postgres://postgres:pw@127.0.0.1:7432/postgres?sslmode=verify-full&sslrootcert=" + dir + "/tls/ca.crt'\n" +
			"export SHARDVISOR_PG1_POOL_DSN='postgres://postgres:pw@127.0.0.1:9432/postgres?sslmode=verify-full&sslrootcert=" + dir + "/tls/ca.crt'\n" +
			"export SHARDVISOR_PG_DSNS='postgres://postgres:pw@127.0.0.1:7432/postgres?sslmode=verify-full&sslrootcert=" + dir + "/tls/ca.crt'\n" +
			"export SHARDVISOR_PG_POOL_DSNS='postgres://postgres:pw@127.0.0.1:9432/postgres?sslmode=verify-full&sslrootcert=" + dir + "/tls/ca.crt'\n" + pgbr, ""},
		{[]string{"--plain", "env", "--pg-nodes", "2"}, 0, "export SHARDVISOR_ZK='127.0.0.1:7811,127.0.0.1:7812,127.0.0.1:7813'\n" +
			"export SHARDVISOR_PG_PASSWORD_FILE='" + dir + "/pg/password'\n" +
			"export PGPASSFILE='" + dir + "/pg/pgpass'\n" +
			"export SHARDVISOR_PG1_DSN='postgres://postgres:pw@127.0.0.1:7432/postgres?sslmode=disable'\n" +
			"export SHARDVISOR_PG1_POOL_DSN='postgres://postgres:pw@127.0.0.1:9432/postgres?sslmode=disable'\n" +
			"export SHARDVISOR_PG2_DSN='postgres://postgres:pw@127.0.0.1:7433/postgres?sslmode=disable'\n" +
			"export SHARDVISOR_PG2_POOL_DSN='postgres://postgres:pw@127.0.0.1:9433/postgres?sslmode=disable'\n" +
			"export SHARDVISOR_PG_DSNS='postgres://postgres:pw@127.0.0.1:7432/postgres?sslmode=disable,postgres://postgres:pw@127.0.0.1:7433/postgres?sslmode=disable'\n" +
			"export SHARDVISOR_PG_POOL_DSNS='postgres://postgres:pw@127.0.0.1:9432/postgres?sslmode=disable,postgres://postgres:pw@127.0.0.1:9433/postgres?sslmode=disable'\n" + pgbr, ""},
	} {
		var errb bytes.Buffer
		app := newApp()
		app.ErrWriter = &errb
		out := captureStdout(t, func() {
			if code := cliutil.Exec(context.Background(), app, append([]string{"devenv"}, tc.args...)); code != tc.code {
				t.Errorf("devenv %q: exit %d, want %d (%s)", tc.args, code, tc.code, errb.String())
			}
		})
		if !strings.Contains(errb.String(), tc.errHas) || (tc.out != "" && out != tc.out) {
			t.Errorf("devenv %q: stdout %q stderr %q; want %q and %q", tc.args, out, errb.String(), tc.out, tc.errHas)
		}
	}
}

// captureStdout: the commands print to os.Stdout, as scripts read them.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		var b bytes.Buffer
		_, _ = b.ReadFrom(r)
		done <- b.String()
	}()
	f()
	os.Stdout = old
	w.Close()
	return <-done
}
