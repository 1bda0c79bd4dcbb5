package cliutil

import (
	"slices"
	"testing"

	"github.com/urfave/cli/v2"
)

// EnvAll names a variable after the command path for each flag without
// one, keeps the ones a flag names itself, and Env lists them and reports
// what it cannot cover.
func TestEnvAll(t *testing.T) {
	own := &cli.StringFlag{Name: "zk", EnvVars: []string{"SHARDVISOR_ZK"}}
	node := &cli.StringFlag{Name: "node"}
	dry := &cli.BoolFlag{Name: "dry-run"}
	key := &cli.StringFlag{Name: "key"}
	app := &cli.App{Name: "shardctl", Flags: []cli.Flag{own}, Commands: []*cli.Command{
		{Name: "gc", Flags: []cli.Flag{node, dry}},
		{Name: "table", Subcommands: []*cli.Command{{Name: "add", Flags: []cli.Flag{key}}}},
	}}
	if _, problems := Env(app); len(problems) != 3 {
		t.Fatalf("before: %v", problems)
	}
	EnvAll(app)
	for f, want := range map[interface{ GetEnvVars() []string }]string{own: "SHARDVISOR_ZK", node: "SHARDVISOR_GC_NODE", dry: "SHARDVISOR_GC_DRY_RUN", key: "SHARDVISOR_TABLE_ADD_KEY"} {
		if got := f.GetEnvVars(); !slices.Equal(got, []string{want}) {
			t.Errorf("got %v, want %s", got, want)
		}
	}
	list, problems := Env(app)
	if len(problems) != 0 {
		t.Fatalf("after: %v", problems)
	}
	if want := []string{"shardctl --zk SHARDVISOR_ZK", "shardctl gc --node SHARDVISOR_GC_NODE", "shardctl gc --dry-run SHARDVISOR_GC_DRY_RUN", "shardctl table add --key SHARDVISOR_TABLE_ADD_KEY"}; !slices.Equal(list, want) {
		t.Errorf("list %q, want %q", list, want)
	}
	// Two different flags on one variable are reported.
	app.Commands[0].Flags = append(app.Commands[0].Flags, &cli.StringFlag{Name: "other", EnvVars: []string{"SHARDVISOR_GC_NODE"}})
	if _, problems := Env(app); len(problems) != 1 {
		t.Fatalf("shared variable: %v", problems)
	}
}

// Every flag type the binaries use gets a variable.
func TestEnvAllFlagTypes(t *testing.T) {
	flags := []cli.Flag{&cli.StringFlag{Name: "a"}, &cli.BoolFlag{Name: "b"}, &cli.IntFlag{Name: "c"}, &cli.Uint64Flag{Name: "d"},
		&cli.Float64Flag{Name: "e"}, &cli.DurationFlag{Name: "f"}, &cli.StringSliceFlag{Name: "g"}}
	if _, problems := Env(EnvAll(&cli.App{Name: "x", Flags: flags})); len(problems) != 0 {
		t.Fatal(problems)
	}
}
