package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/cliutil"
)

// init --node and SHARDVISOR_NODES through the command's own flag parsing
// (its action stops after reading the nodes): a multi-host DSN, the form
// docs/failover.md gives a Patroni group, is one node (urfave/cli cut it at
// its comma into pg1 and a node named "h2:5432/app?..."), and the lists
// that worked before still do.
func TestInitNodeTakesAMultiHostDSN(t *testing.T) {
	const group = "pg1=postgres://app@h1:5432,h2:5432/app?target_session_attrs=read-write"
	const plain = "pg2=postgres://app@h3:5432/app"
	for _, tc := range []struct {
		name string
		args []string
		env  string // SHARDVISOR_NODES
		want []string
	}{
		{"the issue's DSN", []string{"--node", group}, "", []string{group}},
		{"repeated", []string{"--node", group, "--node", plain}, "", []string{group, plain}},
		{"one value listing two", []string{"--node", plain + "," + group}, "", []string{plain, group}},
		{"a list with spaces", []string{"--node", plain + " , " + group}, "", []string{plain, group}},
		{"the variable", nil, group + "," + plain, []string{group, plain}},
		{"the variable, postgresql://", nil, "pg3=postgresql://app@h4,h5/app?target_session_attrs=read-write," + plain,
			[]string{"pg3=postgresql://app@h4,h5/app?target_session_attrs=read-write", plain}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("SHARDVISOR_NODES", tc.env)
			}
			nodes, code, stderr := parseInit(t, tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			var got []string
			for _, n := range nodes {
				got = append(got, fmt.Sprintf("%s=%s", n.ID, n.DSN))
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("nodes %q, want %q", got, tc.want)
			}
		})
	}
	// A value that is no ID=DSN is still refused, as a usage error.
	if _, code, stderr := parseInit(t, "--node", group+",h9:5432"); code != cliutil.ExitUsage || !strings.Contains(stderr, "h9:5432") {
		t.Errorf("a DSN with a stray host: exit %d: %s", code, stderr)
	}
	if _, code, stderr := parseInit(t, "--node", "pg1=postgres://app@h1/app,PG2=postgres://h2/app"); code != cliutil.ExitUsage || !strings.Contains(stderr, `node name "PG2" is invalid`) {
		t.Errorf("an invalid name after a comma: exit %d: %s", code, stderr)
	}
	// What urfave/cli's cut at every comma refused stays refused: a list
	// whose next entry is no ID=postgres:// (a typo in its name, another
	// scheme) or is empty (a trailing comma) must not become part of the
	// previous DSN's database name, which validation cannot tell apart.
	for _, tc := range []struct{ name, env, want string }{
		{"a trailing comma", plain + ",", `want ID=DSN`},
		{"an empty entry", plain + ",," + group, `want ID=DSN`},
		{"a space in a name", plain + ", pg 3=postgres://h4/app", `node name "pg 3" is invalid`},
		{"another scheme", plain + ",pg3=mysql://h4/app", `must be a postgres:// URL`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SHARDVISOR_NODES", tc.env)
			if nodes, code, stderr := parseInit(t); code != cliutil.ExitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("SHARDVISOR_NODES=%q: exit %d, nodes %v: %s", tc.env, code, nodes, stderr)
			}
		})
	}
}

// parseInit runs `shardctl init --seed ... ARGS` with an action that only
// reads the nodes.
func parseInit(t *testing.T, args ...string) ([]bucketmap.Node, int, string) {
	t.Helper()
	app := newApp()
	var errb bytes.Buffer
	app.Writer, app.ErrWriter = &bytes.Buffer{}, &errb
	var nodes []bucketmap.Node
	for _, c := range app.Commands {
		if c.Name == "init" {
			c.Action = func(c *cli.Context) (err error) { nodes, err = initNodes(c); return err }
		}
	}
	code := cliutil.Exec(context.Background(), app, append([]string{"shardctl", "init", "--random-seed"}, args...))
	return nodes, code, errb.String()
}

// init --pool (and SHARDVISOR_NODE_POOLS) gives the named nodes their
// application path; a pooler for a node that is not listed, or one with
// a password, is a usage error naming it.
func TestInitPoolGivesNodesTheirApplicationPath(t *testing.T) {
	const g1 = "g1=postgres://app@h1:5432,h2:5432/app?target_session_attrs=read-write"
	const g1pool = "g1=postgres://app@h1:6432,h2:6432/app?target_session_attrs=read-write"
	const plain = "pg2=postgres://app@h3:5432/app"
	t.Setenv("SHARDVISOR_NODE_POOLS", g1pool)
	nodes, code, stderr := parseInit(t, "--node", g1, "--node", plain)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if got := "g1=" + nodes[0].PoolDSN; got != g1pool || nodes[1].PoolDSN != "" {
		t.Errorf("pool dsns %q, %q; want %q and none", nodes[0].PoolDSN, nodes[1].PoolDSN, g1pool)
	}
	t.Setenv("SHARDVISOR_NODE_POOLS", "")
	if _, code, stderr := parseInit(t, "--node", plain, "--pool", "pg9=postgres://app@h9:6432/app"); code != cliutil.ExitUsage || !strings.Contains(stderr, "no --node pg9") {
		t.Errorf("a pooler of no node: exit %d: %s", code, stderr)
	}
	if _, code, stderr := parseInit(t, "--node", plain, "--pool", "pg2=postgres://app:pw@h3:6432/app"); code != cliutil.ExitUsage || !strings.Contains(stderr, "pool dsn") {
		t.Errorf("a pooler with a password: exit %d: %s", code, stderr)
	}
}
