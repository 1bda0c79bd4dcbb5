package cliutil

import (
	"slices"
	"testing"

	"github.com/urfave/cli/v2"
)

// EnvAll names a variable after the command path for each flag without
// one, keeps the ones a flag names itself, and MissingEnv finds what it
// cannot cover.
func TestEnvAll(t *testing.T) {
	own := &cli.StringFlag{Name: "zk", EnvVars: []string{"SHARDVISOR_ZK"}}
	node := &cli.StringFlag{Name: "node"}
	dry := &cli.BoolFlag{Name: "dry-run"}
	key := &cli.StringFlag{Name: "key"}
	app := &cli.App{Name: "shardctl", Flags: []cli.Flag{own}, Commands: []*cli.Command{
		{Name: "gc", Flags: []cli.Flag{node, dry}},
		{Name: "table", Subcommands: []*cli.Command{{Name: "add", Flags: []cli.Flag{key}}}},
	}}
	if got := MissingEnv(app); len(got) != 3 {
		t.Fatalf("before: %v", got)
	}
	EnvAll(app)
	for f, want := range map[interface{ GetEnvVars() []string }]string{own: "SHARDVISOR_ZK", node: "SHARDVISOR_GC_NODE", dry: "SHARDVISOR_GC_DRY_RUN", key: "SHARDVISOR_TABLE_ADD_KEY"} {
		if got := f.GetEnvVars(); !slices.Equal(got, []string{want}) {
			t.Errorf("got %v, want %s", got, want)
		}
	}
	if got := MissingEnv(app); len(got) != 0 {
		t.Fatalf("after: %v", got)
	}
	// Two different flags on one variable are reported.
	app.Commands[0].Flags = append(app.Commands[0].Flags, &cli.StringFlag{Name: "other", EnvVars: []string{"SHARDVISOR_GC_NODE"}})
	if got := MissingEnv(app); len(got) != 1 {
		t.Fatalf("shared variable: %v", got)
	}
}
