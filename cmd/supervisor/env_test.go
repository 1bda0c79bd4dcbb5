package main

import (
	"os"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/internal/cliutil"
)

// Every flag of every command can be set from the environment, each with
// its own variable (except flags meaning the same on several commands), and
// the names, which the docs and operators' scripts use, stay as listed in
// testdata/env.txt.
func TestEveryFlagHasAnEnvironmentVariable(t *testing.T) {
	list, problems := cliutil.Env(cliutil.EnvAll(app()))
	for _, problem := range problems {
		t.Error(problem)
	}
	got := strings.Join(list, "\n") + "\n"
	if want, err := os.ReadFile("testdata/env.txt"); err != nil || got != string(want) {
		t.Errorf("flags and environment variables differ from testdata/env.txt (%v); now:\n%s", err, got)
	}
}
