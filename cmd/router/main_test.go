package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/internal/cliutil"
)

// Usage errors exit 2 and failures 1, with the binary's messages.
func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		code   int
		errHas string
	}{
		{[]string{"--bogus"}, 2, "router: usage error: flag provided but not defined: -bogus"},
		{[]string{"--max-batch", "x"}, 2, `router: usage error: invalid value "x" for flag -max-batch`},
		{[]string{"--listen", "0.0.0.0:1"}, 2, "router: usage error: listen address"},
		{[]string{"--listen", "127.0.0.1:0", "--map-file", "/nonexistent/map.json"}, 1, "router: error: router: open /nonexistent/map.json"},
	} {
		var out, errb bytes.Buffer
		app := newApp()
		app.Writer, app.ErrWriter = &out, &errb
		if code := cliutil.Exec(context.Background(), app, append([]string{"router"}, tc.args...)); code != tc.code || !strings.Contains(errb.String(), tc.errHas) {
			t.Errorf("router %q: exit %d, %q; want %d with %q", tc.args, code, errb.String(), tc.code, tc.errHas)
		}
	}
}

// Every flag of every command can be set from the environment, under the
// names pinned in testdata/env.txt.
func TestEveryFlagHasAnEnvironmentVariable(t *testing.T) {
	cliutil.CheckEnv(t, newApp(), "testdata/env.txt")
}
