// Package python_test runs the Python package's test suite (pytest, from
// Debian's python3-pytest) inside `go test`, so that `make test` runs it
// beside the Go packages, on the servers internal/testenv provides.
package python_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

// python is Debian's interpreter, which has the Debian packages the suite
// needs (a pyenv shim first on PATH would not).
func python(t *testing.T) string {
	for _, p := range []string{"/usr/bin/python3"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		need(t, "python3 is not installed")
	}
	return p
}

func need(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (required when CI=true; scripts/install-deps installs it)", why)
	}
	t.Skip(why)
}

func pythonWithDeps(t *testing.T) string {
	py := python(t)
	if out, err := exec.Command(py, "-c", "import pytest, psycopg2, django, sqlalchemy").CombinedOutput(); err != nil {
		need(t, "the Python suite needs python3-pytest, python3-psycopg2, python3-django and python3-sqlalchemy: "+strings.TrimSpace(string(out)))
	}
	return py
}

// pytest runs pytest on files (relative to tests/) with env, and fails
// the test with its output when it fails.
func pytest(t *testing.T, py string, env []string, files ...string) {
	t.Helper()
	args := []string{"-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:warnings"}
	for _, f := range files {
		args = append(args, filepath.Join("tests", f))
	}
	cmd := exec.Command(py, args...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		t.Fatalf("pytest %s: %v\n%s", strings.Join(files, " "), err, out.String())
	}
	t.Logf("%s:\n%s", strings.Join(files, " "), strings.TrimSpace(out.String()))
}

func TestPythonPackage(t *testing.T) {
	py := pythonWithDeps(t)
	zk := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/shardctl", "./cmd/supervisor", "./cmd/router")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var ports []string
	for _, n := range pg.Nodes {
		ports = append(ports, strconv.Itoa(n.Port))
	}
	env := append(os.Environ(),
		"SHARDVISOR_BIN_DIR="+bin,
		"SHARDVISOR_TEST_ZK="+strings.Join(zk.Servers, ","),
		"SHARDVISOR_PY_ZK_ROOT="+zk.Root,
		"SHARDVISOR_PY_PG_PORTS="+strings.Join(ports, ","),
		"SHARDVISOR_PY_PG_PASSWORD_FILE="+pg.Nodes[0].PasswordFile,
		// Each node's PgBouncer (transaction mode): tests/test_pooler.py.
		"SHARDVISOR_TEST_POOL_DSN_1="+pg.Nodes[0].PoolDSN,
		"SHARDVISOR_TEST_POOL_DSN_2="+pg.Nodes[1].PoolDSN,
		"PYTHONDONTWRITEBYTECODE=1")
	// Four pytest processes at once: most of the suite waits on servers
	// (a supervisor's boot, a move), not on the CPU, and make test's
	// budget is shared. Every test file is in exactly one group.
	groups := [][]string{
		{"test_supervisor.py", "test_sqlalchemy.py"},
		{"test_move.py", "test_django.py", "test_install.py"},
		{"test_db.py"},
		{"test_routing_vectors.py", "test_routing.py", "test_sidecar.py", "test_pooler.py"},
	}
	files, _ := filepath.Glob("tests/test_*.py")
	grouped := map[string]bool{}
	for _, g := range groups {
		for _, f := range g {
			grouped[f] = true
		}
	}
	for _, f := range files {
		if !grouped[filepath.Base(f)] {
			t.Fatalf("%s is in no group of TestPythonPackage: add it to one", f)
		}
	}
	// Subtests started together rather than t.Parallel: -parallel defaults
	// to GOMAXPROCS, which would run two groups at a time on 2 cores.
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(strconv.Itoa(i+1), func(t *testing.T) { pytest(t, py, env, g...) })
		}()
	}
	wg.Wait()
}

// TestFaultsPythonPoolsFollowFailover runs tests/faults/test_failover.py:
// shardvisor.db's writers on a Patroni group whose primary host is
// SIGKILLed.
func TestFaultsPythonPoolsFollowFailover(t *testing.T) {
	testenv.Faults(t)
	py := pythonWithDeps(t)
	testenv.Exclusive(t)
	g := testenv.StartPGGroups(t, 1).Nodes[0]
	num := strings.TrimPrefix(g.Name, "pg")
	env := append(os.Environ(),
		"SHARDVISOR_PY_GROUP_DSN="+g.DSN,
		"SHARDVISOR_PY_GROUP_NUM="+num,
		"SHARDVISOR_PY_GROUP_PASSWORD_FILE="+g.PasswordFile,
		"PYTHONDONTWRITEBYTECODE=1")
	pytest(t, py, env, "faults/test_failover.py")
	g.StartMembers(t)
}
