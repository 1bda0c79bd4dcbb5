package cliutil

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// CheckEnv passes an app whose variables are as the golden file lists them,
// and reports a list that differs from it and a variable two flags share.
func TestCheckEnv(t *testing.T) {
	golden := filepath.Join(t.TempDir(), "env.txt")
	if err := os.WriteFile(golden, []byte("x --zk SHARDVISOR_ZK\nx gc --node SHARDVISOR_GC_NODE\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	app := func(gcFlags ...cli.Flag) *cli.App {
		return &cli.App{Name: "x", Flags: []cli.Flag{&cli.StringFlag{Name: "zk", EnvVars: []string{"SHARDVISOR_ZK"}}},
			Commands: []*cli.Command{{Name: "gc", Flags: append([]cli.Flag{&cli.StringFlag{Name: "node"}}, gcFlags...)}}}
	}
	for _, tc := range []struct {
		app  *cli.App
		want []string // what each report contains, in order
	}{
		{app(), nil},
		{app(&cli.BoolFlag{Name: "dry-run"}), []string{"differ from " + golden + " (<nil>); now:\n" +
			"x --zk SHARDVISOR_ZK\nx gc --node SHARDVISOR_GC_NODE\nx gc --dry-run SHARDVISOR_GC_DRY_RUN\n"}},
		{app(&cli.StringFlag{Name: "other", EnvVars: []string{"SHARDVISOR_GC_NODE"}}), []string{"x gc --other: SHARDVISOR_GC_NODE is also x gc --node's", "differ from"}},
	} {
		var r reports
		CheckEnv(&r, tc.app, golden)
		if len(r) != len(tc.want) {
			t.Errorf("reports %q, want %d", r, len(tc.want))
			continue
		}
		for i, want := range tc.want {
			if !strings.Contains(r[i], want) {
				t.Errorf("report %q lacks %q", r[i], want)
			}
		}
	}
}

// reports collects what CheckEnv reports.
type reports []string

func (r *reports) Helper() {}

func (r *reports) Errorf(format string, args ...any) { *r = append(*r, fmt.Sprintf(format, args...)) }

// A string slice flag in an app that cuts values at commas is reported.
func TestCheckEnvReportsSliceFlagsCutAtCommas(t *testing.T) {
	golden := filepath.Join(t.TempDir(), "env.txt")
	if err := os.WriteFile(golden, []byte("x init --node SHARDVISOR_NODES\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	app := func(disable bool) *cli.App {
		return &cli.App{Name: "x", DisableSliceFlagSeparator: disable, Commands: []*cli.Command{
			{Name: "init", Flags: []cli.Flag{&cli.StringSliceFlag{Name: "node", EnvVars: []string{"SHARDVISOR_NODES"}}}}}}
	}
	var r reports
	CheckEnv(&r, app(false), golden)
	if len(r) != 1 || !strings.Contains(r[0], "x init --node: urfave/cli cuts its values at every comma") {
		t.Errorf("reports %q", r)
	}
	r = nil
	CheckEnv(&r, app(true), golden)
	if len(r) != 0 {
		t.Errorf("with DisableSliceFlagSeparator: %q", r)
	}
}
