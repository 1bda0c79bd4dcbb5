package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/zksession"
)

var bin string

// TestMain builds the real binary once; the tests run it as operators do.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shardctl-test")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "shardctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		panic("building shardctl: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// The in-process commands read PGPASSFILE from the process's environment,
// which parallel tests cannot each t.Setenv: it names one file, in the
// binary's directory, holding every test's pgpass lines.
var (
	pgpassMu   sync.Mutex
	pgpassFile string
)

// usePGPass makes the commands of this test, in-process or run as the
// binary, find the passwords of pg's nodes.
func usePGPass(t *testing.T, pg *testenv.PG) {
	t.Helper()
	b, err := os.ReadFile(pg.Nodes[0].PGPassFile)
	if err != nil {
		t.Fatal(err)
	}
	pgpassMu.Lock()
	defer pgpassMu.Unlock()
	if pgpassFile == "" {
		pgpassFile = filepath.Join(filepath.Dir(bin), "pgpass")
		if err := os.Setenv("PGPASSFILE", pgpassFile); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(pgpassFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

type result struct {
	stdout, stderr string
	code           int
}

func run(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	// The caller's SHARDVISOR_* settings must not leak into the tests.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHARDVISOR_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{out.String(), errb.String(), code}
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	r := run(t, "", args...)
	if r.code != 0 {
		t.Fatalf("shardctl %v: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

const seed = "5eed0000000000000000000000000001"

var lineRE = regexp.MustCompile(`^[^\t]+\t\d+\t[0-9a-f]{16}$`)

func TestHashOutputAndUsageErrors(t *testing.T) {
	out := mustRun(t, "hash", "--seed", seed, "--level", "4", "alice", "bob")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || lines[0] != "alice\t4\t458c1ab0a9698f29" || !lineRE.MatchString(lines[1]) {
		t.Fatalf("hash output %q", out)
	}
	// Flags may follow the arguments, and user ids may come on stdin.
	if got := run(t, "alice\nbob\n", "hash", "--seed", seed, "--level", "4"); got.stdout != out {
		t.Fatalf("stdin input gave %q", got.stdout)
	}
	if got := mustRun(t, "hash", "alice", "bob", "--seed", seed, "--level", "4"); got != out {
		t.Fatalf("flags after arguments gave %q", got)
	}
	js := mustRun(t, "hash", "--json", "--seed", seed, "--level", "4", "alice")
	var line hashLine
	if err := json.Unmarshal([]byte(js), &line); err != nil || line.Bucket != 4 || line.Prefix64 != "458c1ab0a9698f29" || line.Level != 4 {
		t.Fatalf("json %q: %+v %v", js, line, err)
	}
	for _, tc := range []struct {
		args   []string
		errHas string
	}{
		{[]string{"hash", "--seed", seed, "alice"}, "--level is required"},
		{[]string{"hash", "--seed", "abc", "--level", "2", "a"}, "odd number of hex digits"},
		{[]string{"hash", "--seed", "00", "--level", "2", "a"}, "want at least 16"},
		{[]string{"hash", "--seed", seed, "--level", "33", "a"}, "level"},
		{[]string{"hash", "--bogus"}, "flag provided but not defined"},
		{[]string{"nosuchcommand"}, "unknown command"},
		{[]string{"--zk", "nohost", "status"}, `server "nohost" is not host:port`},
		{[]string{"--cluster", "Bad/Name", "status"}, "cluster name"},
		{[]string{"init", "--random-seed"}, "at least one --node"},
		{[]string{"init", "--seed", seed, "--node", "n1=postgres://u:pw@h/d"}, "contains a password"},
		{[]string{"init", "--seed", seed, "--level", "18", "--node", "n1=postgres://h/d"}, "out of range"},
		{[]string{"assign", "3"}, "want BUCKET NODE"},
		{[]string{"simulate", "explode:n1"}, "unknown kind"},
	} {
		r := run(t, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.errHas) {
			t.Errorf("shardctl %v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, r.code, r.stderr, tc.errHas)
		}
		if strings.Contains(r.stderr, "pw@") {
			t.Errorf("stderr leaks a password: %s", r.stderr)
		}
	}
}

func TestSimulateOffline(t *testing.T) {
	out := mustRun(t, "simulate", "--json", "--level", "6", "--nodes", "a,b,c=2", "add:d", "down:b", "drain:c", "split")
	var res struct {
		Steps []bucketmap.SimStep `json:"steps"`
		Final bucketmap.Summary   `json:"final"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 4 || res.Steps[1].Reassigned == 0 || res.Steps[3].Level != 7 || !res.Final.Balanced {
		t.Fatalf("simulation: %+v", res)
	}
	for _, s := range res.Steps {
		if s.Moves != s.LowerBound {
			t.Fatalf("step %s: %d moves, lower bound %d", s.Event, s.Moves, s.LowerBound)
		}
	}
}

// The whole admin surface against the real ensemble.
func TestIntegrationClusterLifecycle(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	cmd := clusterCmd(z, "life")
	dsn := func(port string) string { return "postgres://postgres@127.0.0.1:" + port + "/app" }

	out := mustRun(t, cmd("init", "--level", "4", "--seed", seed, "--password", "env:PGPASSWORD",
		"--node", "pg1="+dsn("25432"), "--node", "pg2="+dsn("25433"), "--node", "pg3="+dsn("25434"))...)
	if !strings.Contains(out, "created cluster life") || !strings.Contains(out, "balanced") {
		t.Fatalf("init: %s", out)
	}
	r := run(t, "", cmd("init", "--level", "4", "--random-seed", "--node", "x="+dsn("1"))...)
	if r.code != 1 || !strings.Contains(r.stderr, "already exists") {
		t.Fatalf("second init: %d %s", r.code, r.stderr)
	}

	status := func() bucketmap.Summary {
		var s bucketmap.Summary
		if err := json.Unmarshal([]byte(mustRun(t, cmd("status", "--json")...)), &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := status()
	if s.Level == nil || *s.Level != 4 || s.MinDepth != 4 || s.MaxDepth != 4 || s.Version != 1 || len(s.Nodes) != 3 || s.Nodes[0].Buckets != 6 || !s.Balanced {
		t.Fatalf("status: %+v", s)
	}
	grid := mustRun(t, cmd("status", "--grid")...)
	if !strings.Contains(grid, "pg1 pg2 pg3") || strings.Count(grid, "#") < 16 {
		t.Fatalf("grid:\n%s", grid)
	}

	// hash without --seed uses the cluster's seed and level.
	if got := mustRun(t, cmd("hash", "alice")...); got != "alice\t4\t458c1ab0a9698f29\n" {
		t.Fatalf("hash from the cluster: %q", got)
	}

	// route answers like the sidecar, from the live map.
	var rt struct {
		Node   string `json:"node"`
		Bucket uint32 `json:"bucket"`
		Moved  bool   `json:"moved"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, cmd("route", "--json", "alice")...)), &rt); err != nil || rt.Bucket != 4 || rt.Node != "pg1" {
		t.Fatalf("route alice: %+v %v", rt, err)
	}

	// A node joins; the plan balances it at the lower bound.
	mustRun(t, cmd("node", "add", "pg4", dsn("25435"), "--weight", "1", "--password", "env:PGPASSWORD", "--pool-dsn", dsn("27435"))...)
	// A pooler stays through set-dsn unless it names one; "" removes it.
	poolOf := func(id bucketmap.NodeID) string {
		for _, n := range status().Nodes {
			if n.ID == id {
				return n.PoolDSN
			}
		}
		t.Fatalf("no node %s", id)
		return ""
	}
	if got := poolOf("pg4"); got != dsn("27435") {
		t.Fatalf("pg4's pooler after add: %q", got)
	}
	if out := mustRun(t, cmd("node", "set-dsn", "pg4", dsn("25435")+"?connect_timeout=3")...); !strings.Contains(out, "applications through the pooler at "+dsn("27435")) {
		t.Fatalf("set-dsn without --pool-dsn: %s", out)
	}
	if got := poolOf("pg4"); got != dsn("27435") {
		t.Fatalf("set-dsn without --pool-dsn lost the pooler: %q", got)
	}
	if out := mustRun(t, cmd("node", "set-dsn", "pg4", dsn("25435"), "--pool-dsn", "")...); !strings.Contains(out, "no pooler") {
		t.Fatalf("set-dsn --pool-dsn '': %s", out)
	}
	if got := poolOf("pg4"); got != "" {
		t.Fatalf("set-dsn --pool-dsn '' kept the pooler: %q", got)
	}
	v := status().Version
	var plan bucketmap.Plan
	if err := json.Unmarshal([]byte(mustRun(t, cmd("plan", "--json")...)), &plan); err != nil {
		t.Fatal(err)
	}
	if len(plan.Moves) != 4 || plan.LowerBound != 4 || plan.Target["pg4"] != 4 {
		t.Fatalf("plan after join: %+v", plan)
	}
	for _, mv := range plan.Moves {
		if mv.To != "pg4" {
			t.Fatalf("move %+v", mv)
		}
	}
	if status().Version != v {
		t.Fatal("plan changed the map")
	}

	// Split keeps alice on the same node.
	before := mustRun(t, cmd("hash", "alice")...)
	mustRun(t, cmd("split")...)
	s = status()
	if s.Level == nil || *s.Level != 5 || s.Buckets != 32 {
		t.Fatalf("after split: %+v", s)
	}
	after := mustRun(t, cmd("hash", "alice")...)
	if !strings.HasPrefix(after, "alice\t8\t") || !strings.HasPrefix(before, "alice\t4\t") {
		t.Fatalf("alice %q -> %q", before, after)
	}

	// Manual assign needs --no-copy, and validates its input.
	for _, tc := range []struct {
		args   []string
		code   int
		errHas string
	}{
		{[]string{"assign", "3", "pg4"}, 2, "--no-copy"},
		{[]string{"assign", "99", "pg4", "--no-copy"}, 1, "bucket 99, the map has 32 buckets"},
		{[]string{"assign", "3", "ghost", "--no-copy"}, 1, `unknown db node "ghost"`},
		{[]string{"node", "drain", "ghost"}, 1, "unknown db node"},
		{[]string{"node", "set-weight", "pg1", "0"}, 2, "1..10000"},
		{[]string{"node", "remove", "pg1"}, 1, "still owns"},
		{[]string{"node", "add", "pg5", "postgres://u:secret@h/d"}, 2, "contains a password"},
	} {
		r := run(t, "", cmd(tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.errHas) {
			t.Errorf("%v: exit %d, %q; want %d mentioning %q", tc.args, r.code, r.stderr, tc.code, tc.errHas)
		}
	}
	mustRun(t, cmd("assign", "3", "pg4", "--no-copy")...)

	// A node dies: its buckets go to the others at once, marked lost.
	var down map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, cmd("node", "down", "pg2", "--json")...)), &down); err != nil {
		t.Fatal(err)
	}
	s = status()
	lost := 0
	for _, b := range s.Flagged {
		if b.DataLost {
			lost++
		}
	}
	if s.Nodes[1].Buckets != 0 || lost < 8 || s.History == 0 || !s.Balanced {
		t.Fatalf("after pg2 down: %+v", s)
	}
	mustRun(t, cmd("node", "up", "pg2")...)
	mustRun(t, cmd("node", "drain", "pg3")...)
	mustRun(t, cmd("node", "set-weight", "pg1", "3")...)
	var plan2 bucketmap.Plan
	json.Unmarshal([]byte(mustRun(t, cmd("plan", "--json", "--concurrency", "2")...)), &plan2)
	if plan2.Target["pg3"] != 0 && len(plan2.Target) != 3 {
		t.Fatalf("plan with pg3 draining: %+v", plan2.Target)
	}
	mustRun(t, cmd("simulate", "--live", "add:pg9")...)
}

func TestIntegrationMalformedZnodeAndACL(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	base := []string{"--zk", z.ConnectString, "--zk-root", z.Root}
	mustRun(t, append(base, "--cluster", "hand", "init", "--seed", seed, "--node", "n1=postgres://h/d")...)
	s, err := zksession.Open(zksession.Config{Connect: z.ConnectString})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	mapPath := z.Root + "/hand/map"
	if _, err := s.Set(ctx, mapPath, []byte(`{"version":1,"map_version":3,"level":1,"nodes":[],"owners":"AAAAAA==","typo":1}`), zksession.AnyVersion); err != nil {
		t.Fatal(err)
	}
	r := run(t, "", append(base, "--cluster", "hand", "status")...)
	if r.code != 1 || !strings.Contains(r.stderr, mapPath) || !strings.Contains(r.stderr, `unknown field "typo"`) {
		t.Fatalf("status on a malformed map: %d %s", r.code, r.stderr)
	}

	// A cluster with ACLs: the reader can look but not touch.
	sec := append(append([]string{}, base...), "--cluster", "sec")
	mustRun(t, append(append([]string{}, sec...), "--zk-auth", "admin:adm1n", "init", "--seed", seed, "--reader-auth", "reader:r3ad",
		"--node", "n1=postgres://h1/d", "--node", "n2=postgres://h2/d")...)
	asReader := append(append([]string{}, sec...), "--zk-auth", "reader:r3ad")
	mustRun(t, append(asReader, "status")...)
	r = run(t, "", append(asReader, "node", "drain", "n1")...)
	if r.code != 1 || !strings.Contains(r.stderr, "not authorized") {
		t.Fatalf("reader drain: %d %s", r.code, r.stderr)
	}
	r = run(t, "", append(sec, "status")...)
	if r.code != 1 || !strings.Contains(r.stderr, "not authorized") {
		t.Fatalf("anonymous status: %d %s", r.code, r.stderr)
	}
	if strings.Contains(r.stderr+r.stdout, "adm1n") || strings.Contains(r.stderr, "r3ad") {
		t.Fatal("a credential was printed")
	}
	mustRun(t, append(append([]string{}, sec...), "--zk-auth", "admin:adm1n", "node", "drain", "n1")...)
}
