package cliutil

import (
	"regexp"
	"strings"

	"github.com/urfave/cli/v2"
)

// Repeated flags whose values can hold commas. urfave/cli splits every
// value of a slice flag, and of its environment variable, at each comma:
// `--node "pg1=postgres://app@h1:5432,h2:5432/app"` (a Patroni group's
// multi-host DSN) became the node pg1 and a node named
// "h2:5432/app?...". So the binaries turn that off
// (cli.App.DisableSliceFlagSeparator, which CheckEnv requires of every app
// with a string slice flag), and a flag that may still list several values
// in one, as its environment variable must, splits them itself where a
// value cannot be cut in two: SplitNodes for ID=DSN lists.

// nodeStart is a comma that begins the next ID=DSN of a list: the node's
// name, '=' and a postgres URL. A comma inside a DSN (between hosts, in a
// query value) is followed by neither.
var nodeStart = regexp.MustCompile(`,\s*[A-Za-z0-9_.-]+=(?i:postgres(?:ql)?://)`)

// SplitNodes returns the ID=DSN values of a repeated flag such as
// `shardctl init --node`, one per node: each given value may list several,
// separated by commas ("pg1=postgres://h1/app,pg2=postgres://h2/app", the
// form of the flag's environment variable), and a comma splits only before
// the next ID=postgres:// (or postgresql://), so a multi-host DSN stays
// whole. Spaces around a value are dropped, as urfave/cli drops them.
func SplitNodes(values []string) []string {
	var out []string
	for _, v := range values {
		for {
			loc := nodeStart.FindStringIndex(v)
			if loc == nil {
				break
			}
			out = append(out, strings.TrimSpace(v[:loc[0]]))
			v = v[loc[0]+1:]
		}
		out = append(out, strings.TrimSpace(v))
	}
	return out
}

// sliceProblems reports the string slice flags of an app that splits
// their values at commas.
func sliceProblems(app *cli.App) []string {
	if app.DisableSliceFlagSeparator {
		return nil
	}
	var problems []string
	walk(app, func(path []string, flags []cli.Flag, _ *cli.Command) {
		for _, f := range flags {
			if _, ok := f.(*cli.StringSliceFlag); ok {
				name := strings.Join(append([]string{app.Name}, path...), " ") + " --" + f.Names()[0]
				problems = append(problems, name+": urfave/cli cuts its values at every comma (a DSN holds some); "+
					"set DisableSliceFlagSeparator on the app and split lists with SplitNodes")
			}
		}
	})
	return problems
}
