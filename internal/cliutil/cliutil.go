// Package cliutil is what shardvisor's three binaries share on the command
// line: the ZooKeeper flags (each with an environment variable), logging,
// --json output, and exit codes (2 for usage errors, 1 for failures).
package cliutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// LocalZK is the connect string of the local ensemble that scripts/devenv
// starts; it is the default so that the quick start needs no flags.
const LocalZK = "127.0.0.1:21811,127.0.0.1:21812,127.0.0.1:21813"

// Exit codes.
const (
	ExitFailure = 1
	ExitUsage   = 2
)

// usageError marks a mistake in how the command was called.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// Usagef returns an error that makes the process exit with status 2.
func Usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// IsUsage reports whether err is a usage error.
func IsUsage(err error) bool {
	var u *usageError
	return errors.As(err, &u)
}

// Flag names shared by the binaries.
const (
	FlagZK             = "zk"
	FlagZKRoot         = "zk-root"
	FlagCluster        = "cluster"
	FlagZKAuth         = "zk-auth"
	FlagZKAuthFile     = "zk-auth-file"
	FlagSessionTimeout = "zk-session-timeout"
	FlagZKTimeout      = "zk-timeout"
	FlagJSON           = "json"
	FlagLogLevel       = "log-level"
	FlagLogFormat      = "log-format"
)

// ZKFlags are the flags that say which ZooKeeper, which cluster, and as whom.
func ZKFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: FlagZK, Value: LocalZK, EnvVars: []string{"SHARDVISOR_ZK"},
			Usage: "ZooKeeper connect string `host:port,...[/chroot]`; the default is the local ensemble of scripts/devenv"},
		&cli.StringFlag{Name: FlagZKRoot, Value: topo.DefaultRoot, EnvVars: []string{"SHARDVISOR_ZK_ROOT"},
			Usage: "ZooKeeper `path` under which clusters live"},
		&cli.StringFlag{Name: FlagCluster, Value: "default", EnvVars: []string{"SHARDVISOR_CLUSTER"},
			Usage: "cluster `name`"},
		&cli.StringFlag{Name: FlagZKAuth, EnvVars: []string{"SHARDVISOR_ZK_AUTH"},
			Usage: "ZooKeeper digest identity `user:password` (prefer --zk-auth-file; never logged)"},
		&cli.StringFlag{Name: FlagZKAuthFile, EnvVars: []string{"SHARDVISOR_ZK_AUTH_FILE"},
			Usage: "`file` whose first line is the ZooKeeper digest identity user:password"},
		&cli.DurationFlag{Name: FlagSessionTimeout, Value: zksession.DefaultSessionTimeout, EnvVars: []string{"SHARDVISOR_ZK_SESSION_TIMEOUT"},
			Usage: "ZooKeeper session `timeout` to ask for (the server may clamp it)"},
		&cli.DurationFlag{Name: FlagZKTimeout, Value: zksession.DefaultOpTimeout, EnvVars: []string{"SHARDVISOR_ZK_TIMEOUT"},
			Usage: "bound on each ZooKeeper call (`duration`)"},
	}
}

// OutputFlags are --json and the logging flags.
func OutputFlags(defaultLevel string) []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: FlagJSON, EnvVars: []string{"SHARDVISOR_JSON"},
			Usage: "print machine-readable JSON instead of text"},
		&cli.StringFlag{Name: FlagLogLevel, Value: defaultLevel, EnvVars: []string{"SHARDVISOR_LOG_LEVEL"},
			Usage: "log `level`: debug, info, warn, error"},
		&cli.StringFlag{Name: FlagLogFormat, Value: "console", EnvVars: []string{"SHARDVISOR_LOG_FORMAT"},
			Usage: "log `format`: console or json (logs go to stderr)"},
	}
}

// Logger builds the process logger from the logging flags.
func Logger(c *cli.Context) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(String(c, FlagLogLevel))
	if err != nil {
		return nil, Usagef("--%s: %v", FlagLogLevel, err)
	}
	var cfg zap.Config
	switch String(c, FlagLogFormat) {
	case "json":
		cfg = zap.NewProductionConfig()
	case "console":
		cfg = zap.NewDevelopmentConfig()
		cfg.Development = false
		cfg.DisableStacktrace = true
	default:
		return nil, Usagef("--%s must be console or json, not %q", FlagLogFormat, String(c, FlagLogFormat))
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.OutputPaths = []string{"stderr"}
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	return cfg.Build()
}

// Paths returns the cluster's paths from --zk-root and --cluster.
func Paths(c *cli.Context) (topo.Paths, error) {
	p, err := topo.NewPaths(String(c, FlagZKRoot), String(c, FlagCluster))
	if err != nil {
		return topo.Paths{}, Usagef("%v", err)
	}
	return p, nil
}

// SessionConfig builds a zksession.Config from the flags.
func SessionConfig(c *cli.Context, log *zap.Logger) (zksession.Config, error) {
	if _, err := zksession.ParseConnect(String(c, FlagZK)); err != nil {
		return zksession.Config{}, Usagef("--%s: %v", FlagZK, err)
	}
	cfg := zksession.Config{
		Connect:        String(c, FlagZK),
		SessionTimeout: Duration(c, FlagSessionTimeout),
		OpTimeout:      Duration(c, FlagZKTimeout),
		Logger:         log,
	}
	cred, err := zksession.LoadCredential(String(c, FlagZKAuth), String(c, FlagZKAuthFile))
	if err != nil {
		return cfg, Usagef("zookeeper credential: %v", err)
	}
	if cred != nil {
		cfg.Auth = []zksession.Credential{*cred}
	}
	return cfg, nil
}

// Open opens a session from the flags without waiting for it to connect:
// for daemons, which run (and say they are not ready) while ZooKeeper is
// away.
func Open(c *cli.Context, log *zap.Logger) (*zksession.Session, error) {
	s, _, err := open(c, log)
	return s, err
}

func open(c *cli.Context, log *zap.Logger) (*zksession.Session, zksession.Config, error) {
	cfg, err := SessionConfig(c, log)
	if err != nil {
		return nil, cfg, err
	}
	s, err := zksession.Open(cfg)
	return s, cfg, err
}

// Connect opens a session from the flags and waits (up to --zk-timeout plus
// a session timeout) for it to connect, so a CLI command fails with a clear
// message instead of hanging when ZooKeeper is unreachable.
func Connect(c *cli.Context, log *zap.Logger) (*zksession.Session, error) {
	s, cfg, err := open(c, log)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.Context, cfg.OpTimeout+cfg.SessionTimeout)
	defer cancel()
	if err := s.WaitConnected(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("cannot reach ZooKeeper at %s: %w (is it running? `scripts/devenv status`)", cfg.Connect, err)
	}
	return s, nil
}

// Printer writes either human text or JSON, per --json.
type Printer struct {
	JSON bool
	W    io.Writer
}

// NewPrinter returns a Printer to stdout honouring --json.
func NewPrinter(c *cli.Context) *Printer {
	return &Printer{JSON: Bool(c, FlagJSON), W: c.App.Writer}
}

// Emit prints v as one JSON line under --json, or calls human otherwise.
func (p *Printer) Emit(v any, human func(w io.Writer)) error {
	if p.JSON {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.W, "%s\n", b)
		return err
	}
	human(p.W)
	return nil
}

// Intersperse reorders argv so that operators can write flags anywhere, as
// they do ("shardctl assign 3 n2 --no-copy", "shardctl status --json"):
// urfave/cli v2 stops reading flags at the first argument and reads global
// flags only before the command. Global flags given after the command move
// to the front; the leaf command's own flags move before its arguments.
// Tokens after "--" stay arguments.
func Intersperse(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	cmds := app.Commands
	var leaf *cli.Command
	i := 1
	// Global flags and the command path.
	for ; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			out = append(out, a)
			if takesValue(app.Flags, a) && !strings.Contains(a, "=") && i+1 < len(args) {
				i++
				out = append(out, args[i])
			}
			continue
		}
		var next *cli.Command
		for _, c := range cmds {
			if c.HasName(a) {
				next = c
			}
		}
		if next == nil {
			break
		}
		out = append(out, a)
		leaf, cmds = next, next.Subcommands
		if len(cmds) == 0 {
			i++
			break
		}
	}
	// A command with subcommands that is given arguments instead
	// ("shardctl move 5 --to n2") is the leaf itself.
	if leaf == nil {
		return append(out, args[i:]...)
	}
	var global, flags, pos, rest []string
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = args[i+1:]
			break
		}
		if strings.HasPrefix(a, "-") && lookup(leaf.Flags, a) == nil && lookup(app.Flags, a) != nil {
			global = append(global, a)
			if takesValue(app.Flags, a) && !strings.Contains(a, "=") && i+1 < len(args) {
				i++
				global = append(global, args[i])
			}
			continue
		}
		// Unknown flags stay flags, so that they are still usage errors.
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			flags = append(flags, a)
			if takesValue(leaf.Flags, a) && !strings.Contains(a, "=") && i+1 < len(args) {
				i++
				flags = append(flags, args[i])
			}
			continue
		}
		pos = append(pos, a)
	}
	out = append(append([]string{args[0]}, global...), out[1:]...)
	out = append(out, flags...)
	if len(pos)+len(rest) > 0 {
		out = append(out, "--")
		out = append(append(out, pos...), rest...)
	}
	return out
}

func lookup(flags []cli.Flag, arg string) cli.Flag {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

func takesValue(flags []cli.Flag, arg string) bool {
	f := lookup(flags, arg)
	if f == nil {
		return false
	}
	_, isBool := f.(*cli.BoolFlag)
	return !isBool
}

// String, Bool, Int and Duration read a flag from the nearest command that
// defines it (global flags live on the app; see Intersperse).
func String(c *cli.Context, name string) string          { return c.String(name) }
func Bool(c *cli.Context, name string) bool              { return c.Bool(name) }
func Int(c *cli.Context, name string) int                { return c.Int(name) }
func Duration(c *cli.Context, name string) time.Duration { return c.Duration(name) }

// EnvAll gives every flag without an environment variable one named after
// its command path, SHARDVISOR_<COMMAND>_<SUBCOMMAND>_<FLAG> (dashes become
// underscores), so that every flag can be set from the environment and
// --help shows which variable. Flags that name their own keep them.
func EnvAll(app *cli.App) *cli.App {
	var walk func(prefix string, flags []cli.Flag, cmds []*cli.Command)
	walk = func(prefix string, flags []cli.Flag, cmds []*cli.Command) {
		for _, f := range flags {
			v := reflect.ValueOf(f)
			if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
				continue
			}
			ev := v.Elem().FieldByName("EnvVars")
			if !ev.IsValid() || !ev.CanSet() || ev.Len() > 0 || len(f.Names()) == 0 {
				continue
			}
			ev.Set(reflect.ValueOf([]string{envName(prefix + "_" + f.Names()[0])}))
		}
		for _, c := range cmds {
			walk(prefix+"_"+c.Name, c.Flags, c.Subcommands)
		}
	}
	walk("SHARDVISOR", app.Flags, app.Commands)
	return app
}

func envName(s string) string {
	return strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(s))
}

// MissingEnv lists the flags ("command --flag") with no environment
// variable, and variables that two flags share, for tests.
func MissingEnv(app *cli.App) []string {
	var out []string
	seen := map[string]string{}
	var walk func(path string, flags []cli.Flag, cmds []*cli.Command)
	walk = func(path string, flags []cli.Flag, cmds []*cli.Command) {
		for _, f := range flags {
			if _, isHelp := f.(*cli.BoolFlag); isHelp && f.Names()[0] == "help" {
				continue
			}
			name := strings.TrimSpace(path + " --" + f.Names()[0])
			df, ok := f.(cli.DocGenerationFlag)
			if !ok || len(df.GetEnvVars()) == 0 {
				out = append(out, name+": no environment variable")
				continue
			}
			for _, e := range df.GetEnvVars() {
				// Flags that mean the same on several commands may share
				// a variable (the ZooKeeper and output flags do).
				if other, dup := seen[e]; dup && !strings.HasSuffix(other, " --"+f.Names()[0]) {
					out = append(out, fmt.Sprintf("%s: %s is also %s's", name, e, other))
				}
				seen[e] = name
			}
		}
		for _, c := range cmds {
			walk(path+" "+c.Name, c.Flags, c.Subcommands)
		}
	}
	walk(app.Name, app.Flags, app.Commands)
	return out
}

// Run runs app with os.Args and exits with the right status: 0, 1 for
// failures, 2 for usage errors (bad or missing flags, unknown commands).
// Every flag gets an environment variable (EnvAll).
func Run(app *cli.App) {
	EnvAll(app)
	name := app.Name
	usage := func(c *cli.Context, err error, _ bool) error {
		return Usagef("%v", err)
	}
	app.OnUsageError = usage
	var fix func([]*cli.Command)
	fix = func(cmds []*cli.Command) {
		for _, cmd := range cmds {
			cmd.OnUsageError = usage
			fix(cmd.Subcommands)
		}
	}
	fix(app.Commands)
	app.CommandNotFound = func(c *cli.Context, cmd string) {
		fmt.Fprintf(c.App.ErrWriter, "%s: unknown command %q; see '%s --help'\n", name, cmd, name)
		os.Exit(ExitUsage)
	}
	app.ExitErrHandler = func(*cli.Context, error) {} // we choose the exit code below
	if app.ErrWriter == nil {
		app.ErrWriter = os.Stderr
	}
	err := app.Run(Intersperse(app, os.Args))
	if err == nil {
		return
	}
	if IsUsage(err) || strings.HasPrefix(err.Error(), "flag provided but not defined") || strings.Contains(err.Error(), "Required flag") {
		fmt.Fprintf(app.ErrWriter, "%s: usage error: %v\n", name, err)
		os.Exit(ExitUsage)
	}
	fmt.Fprintf(app.ErrWriter, "%s: error: %v\n", name, err)
	os.Exit(ExitFailure)
}
