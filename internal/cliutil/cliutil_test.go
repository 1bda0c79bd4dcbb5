package cliutil

import (
	"reflect"
	"testing"

	"github.com/urfave/cli/v2"
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
	} {
		if got := Intersperse(app, tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Intersperse(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestUsageErrorsAreRecognised(t *testing.T) {
	if !IsUsage(Usagef("bad %s", "flag")) || IsUsage(errPlain{}) {
		t.Fatal("IsUsage")
	}
}

type errPlain struct{}

func (errPlain) Error() string { return "plain" }
