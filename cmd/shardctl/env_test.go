package main

import (
	"testing"

	"github.com/shardvisor/shardvisor/internal/cliutil"
)

// Every flag of every command can be set from the environment, each with
// its own variable (except flags meaning the same on several commands).
func TestEveryFlagHasAnEnvironmentVariable(t *testing.T) {
	for _, problem := range cliutil.MissingEnv(cliutil.EnvAll(newApp())) {
		t.Error(problem)
	}
}
