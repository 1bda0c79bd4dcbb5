package cliutil

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/version"
)

func TestIntersperse(t *testing.T) {
	app := &cli.App{
		Flags: []cli.Flag{&cli.StringFlag{Name: "zk"}, &cli.BoolFlag{Name: "json"}},
		Commands: []*cli.Command{
			{Name: "assign", Flags: []cli.Flag{&cli.BoolFlag{Name: "no-copy"}, &cli.IntFlag{Name: "retries"}}},
			{Name: "node", Subcommands: []*cli.Command{{Name: "add", Flags: []cli.Flag{&cli.IntFlag{Name: "weight"}}}}},
			{Name: "move", Flags: []cli.Flag{&cli.StringFlag{Name: "to"}}, Subcommands: []*cli.Command{{Name: "status"}}},
		},
	}
	for _, tc := range []struct{ in, want []string }{
		{[]string{"x", "assign", "3", "n2", "--no-copy"}, []string{"x", "assign", "--no-copy", "--", "3", "n2"}},
		{[]string{"x", "assign", "3", "--retries", "4", "n2"}, []string{"x", "assign", "--retries", "4", "--", "3", "n2"}},
		{[]string{"x", "assign", "--json", "3", "--zk", "h:1", "n2"}, []string{"x", "--json", "--zk", "h:1", "assign", "--", "3", "n2"}},
		{[]string{"x", "--zk=h:1", "node", "add", "a", "dsn", "--weight=2"}, []string{"x", "--zk=h:1", "node", "add", "--weight=2", "--", "a", "dsn"}},
		{[]string{"x", "assign", "3", "--", "--no-copy"}, []string{"x", "assign", "--", "3", "--no-copy"}},
		{[]string{"x", "assign", "--bogus", "3"}, []string{"x", "assign", "--bogus", "--", "3"}},
		{[]string{"x", "assign"}, []string{"x", "assign"}},
		{[]string{"x", "move", "5", "--to", "n2"}, []string{"x", "move", "--to", "n2", "--", "5"}},
		{[]string{"x", "move", "status", "id-1", "--json"}, []string{"x", "--json", "move", "status", "--", "id-1"}},
		{[]string{"x", "unknown", "a", "--json"}, []string{"x", "unknown", "a", "--json"}},
		{[]string{"x"}, []string{"x"}},
		// A command's flag before its argument, a global flag between
		// commands, and the later of two values wins.
		{[]string{"x", "move", "--to", "n2", "5"}, []string{"x", "move", "--to", "n2", "--", "5"}},
		{[]string{"x", "move", "--to", "n2", "status", "id-1"}, []string{"x", "move", "--to", "n2", "status", "--", "id-1"}},
		{[]string{"x", "node", "--zk", "h:1", "add", "a"}, []string{"x", "--zk", "h:1", "node", "add", "--", "a"}},
		{[]string{"x", "--zk", "a:1", "assign", "--zk", "b:1"}, []string{"x", "--zk", "a:1", "--zk", "b:1", "assign"}},
		// A flag missing its value stays last, where the parser says so.
		{[]string{"x", "assign", "3", "--retries"}, []string{"x", "assign", "--retries"}},
		{[]string{"x", "assign", "3", "--no-copy", "--zk"}, []string{"x", "--zk"}},
		{[]string{"x", "assign", "-", "--no-copy"}, []string{"x", "assign", "--no-copy", "--", "-"}},
	} {
		if got := Intersperse(app, tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Intersperse(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Exec's exit statuses and messages: 0; 2 for usage errors, whether
// urfave/cli finds them (unknown or malformed flags, missing required
// flags, unknown commands) or a command does (Usagef); 1 for failures.
func TestExecExitStatus(t *testing.T) {
	app := func(stdout, stderr *bytes.Buffer) *cli.App {
		return &cli.App{Name: "x", Writer: stdout, ErrWriter: stderr,
			Flags: []cli.Flag{&cli.StringFlag{Name: "zk"}, &cli.BoolFlag{Name: FlagJSON}},
			Commands: []*cli.Command{
				{Name: "ok", ArgsUsage: "[ARG]", Flags: []cli.Flag{&cli.IntFlag{Name: "n"}}, Action: func(c *cli.Context) error {
					stdout.WriteString(c.String("zk") + " " + c.Args().First() + " " + c.String("n"))
					return nil
				}},
				{Name: "fail", Action: func(*cli.Context) error { return errors.New("it broke") }},
				{Name: "quoted", Action: func(*cli.Context) error { return errors.New(`"a" <b> & c`) }},
				{Name: "hinted", Action: func(*cli.Context) error {
					return fmt.Errorf("rebalance: %w", hint.New(errors.New("move m1 stopped"), "shardctl move resume m1"))
				}},
				{Name: "misuse", Action: func(*cli.Context) error { return Usagef("misuse: want %s", "X") }},
				{Name: "wrapped", Action: func(*cli.Context) error {
					return errors.Join(errors.New("context"), Usagef("inner usage"))
				}},
				{Name: "table", Subcommands: []*cli.Command{{Name: "add", ArgsUsage: "TABLE",
					Flags:  []cli.Flag{&cli.StringFlag{Name: "key", Required: true}},
					Action: func(*cli.Context) error { return nil }}}},
			},
		}
	}
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"ok", "a", "--n", "3", "--zk", "h:1"}, 0, "h:1 a 3", ""},
		{[]string{"fail"}, 1, "", "x: error: it broke\n"},
		{[]string{"fail", "--json"}, 1, "", `{"error":"it broke"}` + "\n"},
		{[]string{"quoted", "--json"}, 1, "", `{"error":"\"a\" <b> & c"}` + "\n"},
		{[]string{"hinted"}, 1, "", "x: error: rebalance: move m1 stopped\nhint: shardctl move resume m1\n"},
		{[]string{"hinted", "--json"}, 1, "", `{"error":"rebalance: move m1 stopped","hint":"shardctl move resume m1"}` + "\n"},
		{[]string{"misuse"}, 2, "", "x: usage error: misuse: want X\n"},
		{[]string{"wrapped"}, 2, "", "x: usage error: context\ninner usage\n"},
		{[]string{"ok", "--bogus"}, 2, "", "x: usage error: flag provided but not defined: -bogus\n"},
		{[]string{"--bogus", "ok"}, 2, "", "x: usage error: flag provided but not defined: -bogus\n"},
		{[]string{"ok", "--n", "three"}, 2, "", "x: usage error: invalid value \"three\" for flag -n: parse error\n"},
		{[]string{"ok", "a", "--n"}, 2, "", "x: usage error: flag needs an argument: -n\n"},
		{[]string{"ok", "--zk"}, 2, "", "x: usage error: flag needs an argument: -zk\n"},
		{[]string{"table", "add", "t", "--key", "k"}, 0, "", ""},
		{[]string{"table", "add", "t"}, 2, "", "x: usage error: Required flag \"key\" not set\n"},
		{[]string{"nosuch", "--zk", "h:1"}, 2, "", "x: unknown command \"nosuch\"; see 'x --help'\n"},
		{[]string{"table", "nosuch"}, 2, "", "x: unknown command \"nosuch\"; see 'x --help'\n"},
		{[]string{"ok", "a", "b"}, 2, "", "x: usage error: ok takes at most 1 argument(s) ([ARG]), got 2: [\"a\" \"b\"]\n"},
		{[]string{"fail", "a"}, 2, "", "x: usage error: fail takes no arguments, got [\"a\"]\n"},
		{[]string{"table", "add", "t", "u", "--key", "k"}, 2, "", "x: usage error: table add takes at most 1 argument(s) (TABLE), got 2: [\"t\" \"u\"]\n"},
	} {
		var stdout, stderr bytes.Buffer
		code := Exec(context.Background(), app(&stdout, &stderr), append([]string{"x"}, tc.args...))
		if code != tc.code || stderr.String() != tc.stderr || (tc.stdout != "" && stdout.String() != tc.stdout) {
			t.Errorf("x %q: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
		}
	}
}

func TestMaxArgs(t *testing.T) {
	for _, tc := range []struct {
		usage     string
		n         int
		unlimited bool
	}{
		{"", 0, false},
		{"ID", 1, false},
		{"ID DSN", 2, false},
		{"[plain|gzip]", 1, false},
		{"BUCKET --to NODE", 1, false},
		{"[ID...]", 0, true},
		{"UID... (or one per line on stdin)", 0, true},
		{"EVENT... (add:ID[=W] down:ID drain:ID up:ID remove:ID weight:ID=W split)", 0, true},
	} {
		n, unlimited := MaxArgs(tc.usage)
		if n != tc.n || unlimited != tc.unlimited {
			t.Errorf("MaxArgs(%q) = %d, %v; want %d, %v", tc.usage, n, unlimited, tc.n, tc.unlimited)
		}
	}
}

// Every command answers --version with its name, the module version and
// the commit, exits 0 and runs nothing; -v stays free for subcommands'
// --verbose.
func TestExecVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	ran := false
	app := &cli.App{Name: "x", Writer: &stdout, ErrWriter: &stderr, Action: func(*cli.Context) error { ran = true; return nil },
		Commands: []*cli.Command{{Name: "list", Flags: []cli.Flag{&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}}},
			Action: func(c *cli.Context) error { stdout.WriteString(fmt.Sprint("verbose=", c.Bool("verbose"))); return nil }}}}
	if code := Exec(context.Background(), app, []string{"x", "--version"}); code != 0 || ran {
		t.Fatalf("--version: exit %d, action ran %v, stderr %q", code, ran, stderr.String())
	}
	want := "x " + version.Get().String() + "\n"
	if stdout.String() != want || !strings.Contains(want, "(commit ") {
		t.Fatalf("--version printed %q, want %q", stdout.String(), want)
	}
	stdout.Reset()
	if code := Exec(context.Background(), app, []string{"x", "list", "-v"}); code != 0 || stdout.String() != "verbose=true" {
		t.Fatalf("list -v: exit %d, printed %q (stderr %q)", code, stdout.String(), stderr.String())
	}
}
