// Package cliutil is what shardvisor's three binaries share on the command
// line: the ZooKeeper flags (each with an environment variable) and the
// session they open, logging, --json output, exit codes (2 for usage
// errors, 1 for failures), and the test that pins each binary's variables
// (CheckEnv).
package cliutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/version"
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

// usageError marks a mistake in how the command was called (exit status 2).
type usageError struct{ error }

// Usagef returns an error that makes the process exit with status 2.
func Usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
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
	FlagZKTLSCA        = "zk-tls-ca"
	FlagZKTLSCert      = "zk-tls-cert"
	FlagZKTLSKey       = "zk-tls-key"
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
		&cli.StringFlag{Name: FlagZKTLSCA, EnvVars: []string{"SHARDVISOR_ZK_TLS_CA"},
			Usage: "PEM `file` of the CA that signed the ZooKeeper servers' certificates; with --zk-tls-cert and --zk-tls-key, ZooKeeper is dialled over TLS and this host's certificate is its identity"},
		&cli.StringFlag{Name: FlagZKTLSCert, EnvVars: []string{"SHARDVISOR_ZK_TLS_CERT"},
			Usage: "PEM `file` of this host's certificate for ZooKeeper (its subject is the x509 identity ACLs name)"},
		&cli.StringFlag{Name: FlagZKTLSKey, EnvVars: []string{"SHARDVISOR_ZK_TLS_KEY"},
			Usage: "PEM `file` of the key of --zk-tls-cert (keep it 0600)"},
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
	return newLogger(c.String(FlagLogLevel), c.String(FlagLogFormat), "stderr")
}

// newLogger builds a logger writing to the zap sinks outputs. Stack traces
// come only at DPanic and above, in either format: an error log is an
// operational state an operator reads (ZooKeeper unreachable, a bad config
// refused), not a bug, and zap's production config (--log-format json) put
// a 30-line Go stack under every one of them. A logged error's hint is a
// field of its own (hintCore).
func newLogger(level, format string, outputs ...string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, Usagef("--%s: %v", FlagLogLevel, err)
	}
	var cfg zap.Config
	switch format {
	case "json":
		cfg = zap.NewProductionConfig()
	case "console":
		cfg = zap.NewDevelopmentConfig()
		cfg.Development = false
	default:
		return nil, Usagef("--%s must be console or json, not %q", FlagLogFormat, format)
	}
	cfg.DisableStacktrace = true // the config's level (Error or Warn); DPanic instead, below
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.OutputPaths = outputs
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	return cfg.Build(zap.AddStacktrace(zapcore.DPanicLevel),
		zap.WrapCore(func(c zapcore.Core) zapcore.Core { return hintCore{c} }))
}

// Paths returns the cluster's paths from --zk-root and --cluster.
func Paths(c *cli.Context) (topo.Paths, error) {
	p, err := topo.NewPaths(c.String(FlagZKRoot), c.String(FlagCluster))
	if err != nil {
		return topo.Paths{}, Usagef("%v", err)
	}
	return p, nil
}

// SessionConfig builds a zksession.Config from the flags.
func SessionConfig(c *cli.Context, log *zap.Logger) (zksession.Config, error) {
	if _, err := zksession.ParseConnect(c.String(FlagZK)); err != nil {
		return zksession.Config{}, Usagef("--%s: %v", FlagZK, err)
	}
	cfg := zksession.Config{
		Connect:        c.String(FlagZK),
		SessionTimeout: c.Duration(FlagSessionTimeout),
		OpTimeout:      c.Duration(FlagZKTimeout),
		Logger:         log,
	}
	// Zero would silently mean the library's default; negative, nonsense.
	for _, f := range []string{FlagSessionTimeout, FlagZKTimeout} {
		if d := c.Duration(f); d <= 0 {
			return cfg, Usagef("--%s must be a positive duration, not %s", f, d)
		}
	}
	cred, err := zksession.LoadCredential(c.String(FlagZKAuth), c.String(FlagZKAuthFile))
	if err != nil {
		return cfg, Usagef("zookeeper credential: %v", err)
	}
	if cred != nil {
		cfg.Auth = []zksession.Credential{*cred}
	}
	if err := cfg.UseTLS(c.String(FlagZKTLSCA), c.String(FlagZKTLSCert), c.String(FlagZKTLSKey)); err != nil {
		return cfg, Usagef("--%s, --%s, --%s: %v", FlagZKTLSCA, FlagZKTLSCert, FlagZKTLSKey, err)
	}
	return cfg, nil
}

// Open opens a session from the flags, for the cluster they name (its
// paths, from --zk-root and --cluster, are returned with it), without
// waiting for it to connect: for daemons, which run (and say they are not
// ready) while ZooKeeper is away.
func Open(c *cli.Context, log *zap.Logger) (*zksession.Session, topo.Paths, error) {
	s, paths, _, err := open(c, log)
	return s, paths, err
}

func open(c *cli.Context, log *zap.Logger) (*zksession.Session, topo.Paths, zksession.Config, error) {
	paths, err := Paths(c)
	if err != nil {
		return nil, paths, zksession.Config{}, err
	}
	cfg, err := SessionConfig(c, log)
	if err != nil {
		return nil, paths, cfg, err
	}
	s, err := zksession.Open(cfg)
	return s, paths, cfg, err
}

// Connect is Open, then waits (up to --zk-timeout plus a session timeout)
// for the session to connect, so a CLI command fails with a clear message
// instead of hanging when ZooKeeper is unreachable.
func Connect(c *cli.Context, log *zap.Logger) (*zksession.Session, topo.Paths, error) {
	s, paths, cfg, err := open(c, log)
	if err != nil {
		return nil, paths, err
	}
	ctx, cancel := context.WithTimeout(c.Context, cfg.OpTimeout+cfg.SessionTimeout)
	defer cancel()
	if err := s.WaitConnected(ctx); err != nil {
		s.Close()
		h := "is it running? `scripts/devenv status`"
		if cfg.Dial == nil {
			// A TLS-only ensemble closes a plain connection at once: the
			// library's log says "authentication failed: EOF".
			h += "; if it takes TLS only, pass --zk-tls-ca, --zk-tls-cert and --zk-tls-key (`eval \"$(scripts/devenv env)\"` sets them for a --tls dev environment)"
		}
		return nil, paths, hint.New(fmt.Errorf("cannot reach ZooKeeper at %s: %w", cfg.Connect, err), h)
	}
	return s, paths, nil
}

// Printer writes either human text or JSON, per --json.
type Printer struct {
	JSON bool
	W    io.Writer
}

// NewPrinter returns a Printer to stdout honouring --json.
func NewPrinter(c *cli.Context) *Printer {
	return &Printer{JSON: c.Bool(FlagJSON), W: c.App.Writer}
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
// urfave/cli v2 reads a command's flags only before its first argument and
// the app's flags only before the command. The app's flags move before the
// command path, the last command's own (and unknown ones, which stay usage
// errors) after it, then "--" and the arguments. Tokens after "--" stay
// arguments; a flag missing its value goes last, for the parser to report.
func Intersperse(app *cli.App, args []string) []string {
	var global, path, local, pos []string
	var dangling *[]string
	var own []cli.Flag
	var cur interface{ Command(string) *cli.Command } = app
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch next := cur.Command(a); {
		case a == "--":
			pos, i = append(pos, args[i+1:]...), len(args)
		case next != nil && len(pos) == 0: // a parent's own flags stay its own
			cur, own, path, local = next, next.Flags, append(append(path, local...), a), nil
		case len(a) < 2 || a[0] != '-':
			pos = append(pos, a)
		default:
			f, dst := lookup(own, a), &local
			if f == nil && (path == nil || lookup(app.Flags, a) != nil) {
				f, dst = lookup(app.Flags, a), &global
			}
			*dst = append(*dst, a)
			if v, ok := f.(cli.DocGenerationFlag); ok && v.TakesValue() && !strings.Contains(a, "=") {
				if i+1 == len(args) {
					dangling = dst
				} else {
					i++
					*dst = append(*dst, args[i])
				}
			}
		}
	}
	switch {
	case path == nil:
		return args
	case dangling == &global:
		return slices.Concat(args[:1], global)
	case dangling != nil || len(pos) == 0:
		return slices.Concat(args[:1], global, path, local)
	}
	return slices.Concat(args[:1], global, path, local, []string{"--"}, pos)
}

func lookup(flags []cli.Flag, arg string) cli.Flag {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	for _, f := range flags {
		if slices.Contains(f.Names(), name) {
			return f
		}
	}
	return nil
}

// walk calls fn for the app (cmd nil) and for every command under it, with
// the command's path of names.
func walk(app *cli.App, fn func(path []string, flags []cli.Flag, cmd *cli.Command)) {
	var rec func(path []string, cmds []*cli.Command)
	rec = func(path []string, cmds []*cli.Command) {
		for _, c := range cmds {
			p := append(path[:len(path):len(path)], c.Name)
			fn(p, c.Flags, c)
			rec(p, c.Subcommands)
		}
	}
	fn(nil, app.Flags, nil)
	rec(nil, app.Commands)
}

// envVars is the EnvVars field of the flag types the binaries use (nil for
// others, which the per-binary env tests then report).
func envVars(f cli.Flag) *[]string {
	switch f := f.(type) {
	case *cli.StringFlag:
		return &f.EnvVars
	case *cli.BoolFlag:
		return &f.EnvVars
	case *cli.IntFlag:
		return &f.EnvVars
	case *cli.Uint64Flag:
		return &f.EnvVars
	case *cli.Float64Flag:
		return &f.EnvVars
	case *cli.DurationFlag:
		return &f.EnvVars
	case *cli.StringSliceFlag:
		return &f.EnvVars
	}
	return nil
}

// EnvAll gives every flag without an environment variable one named after
// its command path, SHARDVISOR_<COMMAND>_<SUBCOMMAND>_<FLAG> (dashes become
// underscores), so that every flag can be set from the environment and
// --help shows which variable. Flags that name their own keep them.
func EnvAll(app *cli.App) *cli.App {
	walk(app, func(path []string, flags []cli.Flag, _ *cli.Command) {
		for _, f := range flags {
			if ev := envVars(f); ev != nil && len(*ev) == 0 {
				name := strings.Join(append([]string{"SHARDVISOR"}, append(path, f.Names()[0])...), "_")
				*ev = []string{strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(name))}
			}
		}
	})
	return app
}

// Env lists, for tests, every flag ("shardctl gc --node SHARDVISOR_GC_NODE")
// with its environment variables, and the problems: flags without one, and
// variables that two different flags share.
func Env(app *cli.App) (list, problems []string) {
	seen := map[string]string{}
	walk(app, func(path []string, flags []cli.Flag, _ *cli.Command) {
		for _, f := range flags {
			name := strings.Join(append([]string{app.Name}, path...), " ") + " --" + f.Names()[0]
			var vars []string
			if df, ok := f.(cli.DocGenerationFlag); ok {
				vars = df.GetEnvVars()
			}
			list = append(list, strings.Join(append([]string{name}, vars...), " "))
			if len(vars) == 0 {
				problems = append(problems, name+": no environment variable")
			}
			for _, e := range vars {
				// Flags that mean the same on several commands may share
				// a variable (the ZooKeeper and output flags do).
				if other, dup := seen[e]; dup && !strings.HasSuffix(other, " --"+f.Names()[0]) {
					problems = append(problems, fmt.Sprintf("%s: %s is also %s's", name, e, other))
				}
				seen[e] = name
			}
		}
	})
	return list, problems
}

// T is the part of *testing.T that CheckEnv reports to (this package is
// linked into the binaries, so it does not import package testing).
type T interface {
	Helper()
	Errorf(format string, args ...any)
}

// CheckEnv is each binary's environment test: every flag of every command
// of app can be set from the environment (EnvAll), each with its own
// variable (except flags meaning the same on several commands), the
// names, which the docs and operators' scripts use, stay as listed in the
// file golden (the binary's testdata/env.txt), and no repeated flag's
// values are cut at commas (lists.go).
func CheckEnv(t T, app *cli.App, golden string) {
	t.Helper()
	list, problems := Env(EnvAll(app))
	problems = append(problems, sliceProblems(app)...)
	for _, problem := range problems {
		t.Errorf("%s", problem)
	}
	got := strings.Join(list, "\n") + "\n"
	if want, err := os.ReadFile(golden); err != nil || got != string(want) {
		t.Errorf("flags and environment variables differ from %s (%v); now:\n%s", golden, err, got)
	}
}

// MaxArgs reads a command's ArgsUsage: how many arguments it takes at
// most, or unlimited ("UID...", "[ID...]"). A flag and the word after it
// ("--to NODE") and a parenthesised note are not arguments; "[X]" counts
// as one.
func MaxArgs(usage string) (n int, unlimited bool) {
	for {
		i := strings.Index(usage, "(")
		j := strings.Index(usage, ")")
		if i < 0 || j < i {
			break
		}
		usage = usage[:i] + usage[j+1:]
	}
	words := strings.Fields(usage)
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case strings.HasPrefix(w, "-"):
			i++ // the flag's value
		case strings.Contains(w, "..."):
			return n, true
		default:
			n++
		}
	}
	return n, false
}

// argsChecked refuses, as a usage error, more arguments than the command's
// ArgsUsage names (none when it names none), before its action runs: an
// argument a command ignores silently (`shardctl split 0` split every
// bucket) is an operator's mistake let through.
func argsChecked(name, usage string, action cli.ActionFunc) cli.ActionFunc {
	if action == nil {
		return nil
	}
	max, unlimited := MaxArgs(usage)
	return func(c *cli.Context) error {
		if n := c.NArg(); !unlimited && n > max {
			if max == 0 {
				return Usagef("%s takes no arguments, got %q", name, c.Args().Slice())
			}
			return Usagef("%s takes at most %d argument(s) (%s), got %d: %q", name, max, usage, n, c.Args().Slice())
		}
		return action(c)
	}
}

func init() {
	// --version without urfave/cli's -v alias: subcommands use -v for
	// --verbose, and flags may come anywhere (Intersperse).
	cli.VersionFlag = &cli.BoolFlag{Name: "version", Usage: "print the version (module version and commit) and exit"}
	cli.VersionPrinter = func(c *cli.Context) { fmt.Fprintf(c.App.Writer, "%s %s\n", c.App.Name, c.App.Version) }
}

// Run runs app with os.Args and exits with the status Exec returns.
func Run(app *cli.App) {
	os.Exit(Exec(context.Background(), app, os.Args))
}

// Exec runs app on args (args[0] is the program's name) with every flag's
// environment variable (EnvAll) and flags anywhere (Intersperse), prints
// any error to app.ErrWriter (with its hint on a line of its own, or as a
// JSON object {"error", "hint"} under --json) and returns the exit
// status: 0; 2 for usage
// errors, which are Usagef's, unknown commands, and whatever urfave/cli
// rejects before a command's Action starts (a flag it cannot parse, a
// missing required flag); 1 for other failures.
func Exec(ctx context.Context, app *cli.App, args []string) int {
	started, unknown, asJSON := false, "", false
	start := func(action cli.ActionFunc) cli.ActionFunc {
		if action == nil {
			return nil // urfave/cli shows the help
		}
		return func(c *cli.Context) error { started, asJSON = true, c.Bool(FlagJSON); return action(c) }
	}
	usage := func(_ *cli.Context, err error, _ bool) error { return usageError{err} }
	walk(EnvAll(app), func(path []string, _ []cli.Flag, cmd *cli.Command) {
		if cmd != nil {
			cmd.OnUsageError, cmd.Action = usage, start(argsChecked(strings.Join(path, " "), cmd.ArgsUsage, cmd.Action))
		}
	})
	app.OnUsageError, app.Action = usage, start(app.Action)
	if app.Version == "" {
		// --version on every command: the module version and the commit
		// (internal/version), what an operator upgrading a fleet compares.
		app.Version = version.Get().String()
	}
	app.CommandNotFound = func(_ *cli.Context, cmd string) { unknown = cmd }
	app.ExitErrHandler = func(*cli.Context, error) {} // the status is chosen below
	if app.ErrWriter == nil {
		app.ErrWriter = os.Stderr
	}
	err := app.RunContext(ctx, Intersperse(app, args))
	switch {
	case err == nil && unknown != "":
		fmt.Fprintf(app.ErrWriter, "%s: unknown command %q; see '%s --help'\n", app.Name, unknown, app.Name)
		return ExitUsage
	case err == nil:
		return 0
	case !started || errors.As(err, new(usageError)):
		fmt.Fprintf(app.ErrWriter, "%s: usage error: %v\n", app.Name, err)
		printHint(app.ErrWriter, err)
		return ExitUsage
	case asJSON:
		// One JSON object, the hint a field of its own, for scripts.
		enc := json.NewEncoder(app.ErrWriter)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(struct {
			Error string `json:"error"`
			Hint  string `json:"hint,omitempty"`
		}{err.Error(), hint.Of(err)})
		return ExitFailure
	}
	fmt.Fprintf(app.ErrWriter, "%s: error: %v\n", app.Name, err)
	printHint(app.ErrWriter, err)
	return ExitFailure
}

// printHint prints err's hint (package hint), what to run to mend it, on
// a line of its own.
func printHint(w io.Writer, err error) {
	if h := hint.Of(err); h != "" {
		fmt.Fprintf(w, "hint: %s\n", h)
	}
}

// hintCore adds, to an entry that logs an error with a hint (package
// hint), the hint as a field of its own: a daemon's log says what to run,
// as the error's message did before the hints left it.
type hintCore struct{ zapcore.Core }

func (c hintCore) With(fields []zapcore.Field) zapcore.Core {
	return hintCore{c.Core.With(withHints(fields))}
}

// Check asks the wrapped core (the level, and the JSON format's sampler,
// which counts entries here), and has the entry written through this one.
func (c hintCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Core.Check(e, nil) == nil {
		return ce
	}
	return ce.AddCore(e, c)
}

func (c hintCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.Core.Write(e, withHints(fields))
}

// withHints is fields with a "hint" field after each error field whose
// error has a hint.
func withHints(fields []zapcore.Field) []zapcore.Field {
	var out []zapcore.Field
	for i, f := range fields {
		h := ""
		if err, ok := f.Interface.(error); ok && f.Type == zapcore.ErrorType {
			h = hint.Of(err)
		}
		if h != "" && out == nil {
			out = append(make([]zapcore.Field, 0, len(fields)+1), fields[:i]...)
		}
		if out != nil {
			out = append(out, f)
		}
		if h != "" {
			key := "hint"
			if f.Key != "error" {
				key = f.Key + "_hint"
			}
			out = append(out, zap.String(key, h))
		}
	}
	if out == nil {
		return fields
	}
	return out
}
