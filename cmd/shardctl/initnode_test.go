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
