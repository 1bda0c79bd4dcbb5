// Command supervisor runs one shardvisor worker pool: it binds the pool's
// sockets, runs its workers and swaps them when the pool config (in
// ZooKeeper, or a local file with --config) or the bucket map changes. It
// only parses flags and wires package supervisor; see docs/supervisor.md.
package main

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/supervisor"
)

//go:embed example-config.json
var exampleConfig string

func main() {
	// Workers are started through this same binary (the exec shim, which
	// sets LISTEN_PID to the worker's own pid): handle that before anything.
	supervisor.MaybeRunShim()
	cliutil.Run(app())
}

func app() *cli.App {
	var output []cli.Flag
	for _, f := range cliutil.OutputFlags("info") {
		if f.Names()[0] != cliutil.FlagJSON {
			output = append(output, f)
		}
	}
	flags := append(cliutil.ZKFlags(), output...)
	flags = append(flags,
		&cli.StringFlag{Name: "pool", Value: "default", EnvVars: []string{"SHARDVISOR_POOL"},
			Usage: "pool `name`: the config is read from <zk-root>/<cluster>/pools/<name>/config"},
		&cli.StringFlag{Name: "member", EnvVars: []string{"SHARDVISOR_MEMBER"}, DefaultText: "<hostname>-<pid>",
			Usage: "this supervisor's member `name` in the pool (1-63 of a-z 0-9 - _); a name another live supervisor holds is refused"},
		&cli.StringFlag{Name: "config", EnvVars: []string{"SHARDVISOR_SUPERVISOR_CONFIG"},
			Usage: "run from this local pool config `file` instead of ZooKeeper (polled for changes; no bucket map)"},
		&cli.DurationFlag{Name: "config-poll", Value: supervisor.DefaultConfigPoll, EnvVars: []string{"SHARDVISOR_SUPERVISOR_CONFIG_POLL"},
			Usage: "how often --config is checked for changes (`duration`)"},
		&cli.StringFlag{Name: "state-dir", EnvVars: []string{"SHARDVISOR_STATE_DIR"}, DefaultText: "$RUNTIME_DIRECTORY/<pool> or $TMPDIR/shardvisor-supervisor-<pool>",
			Usage: "`directory` for the map files handed to workers"},
		&cli.StringFlag{Name: "admin", Value: supervisor.DefaultAdminAddr, EnvVars: []string{"SHARDVISOR_ADMIN_ADDR"},
			Usage: "`host:port` of /healthz (the load balancer's probe), /readyz, /livez, /metrics and /status (\"\" disables it)"},
		&cli.StringFlag{Name: "admin-tls-ca", EnvVars: []string{"SHARDVISOR_ADMIN_TLS_CA"},
			Usage: "PEM `file` of the CA of the fleet's admin certificates; with --admin-tls-cert and --admin-tls-key the admin endpoints take HTTPS only, from clients with a certificate of this CA (probes, scrapers, peers), and the fail-static question goes to the peers over TLS"},
		&cli.StringFlag{Name: "admin-tls-cert", EnvVars: []string{"SHARDVISOR_ADMIN_TLS_CERT"},
			Usage: "PEM `file` of this host's admin certificate (served, and shown to peers)"},
		&cli.StringFlag{Name: "admin-tls-key", EnvVars: []string{"SHARDVISOR_ADMIN_TLS_KEY"},
			Usage: "PEM `file` of the key of --admin-tls-cert"},
		&cli.DurationFlag{Name: "debounce", Value: supervisor.DefaultDebounce, EnvVars: []string{"SHARDVISOR_SUPERVISOR_DEBOUNCE"},
			Usage: "quiet `time` after a config or map change before a swap starts (bursts become one swap)"},
		&cli.DurationFlag{Name: "holddown", Value: supervisor.DefaultHolddown, EnvVars: []string{"SHARDVISOR_SUPERVISOR_HOLDDOWN"},
			Usage: "stable connected `time` required after a ZooKeeper session loss before serving again"},
		&cli.BoolFlag{Name: "fail-static", Value: true, EnvVars: []string{"SHARDVISOR_SUPERVISOR_FAIL_STATIC"},
			Usage: "on a ZooKeeper session loss, ask the peers first: if the whole ensemble is down for them too, keep serving the last config and map (false: always leave service)"},
		&cli.StringFlag{Name: "peer-secret-file", EnvVars: []string{"SHARDVISOR_PEER_SECRET_FILE"},
			Usage: "`file` holding the secret shared by the fleet's supervisors that signs their fail-static answers (unset: unauthenticated, see docs/supervisor.md)"},
		&cli.DurationFlag{Name: "peer-refresh", Value: supervisor.DefaultPeerRefresh, EnvVars: []string{"SHARDVISOR_SUPERVISOR_PEER_REFRESH"},
			Usage: "how often the peer list is re-read from the member records (`duration`)"},
		&cli.StringFlag{Name: "upgrade-exec", EnvVars: []string{"SHARDVISOR_UPGRADE_EXEC"}, DefaultText: "this binary's path as resolved at start",
			Usage: "`binary` SIGUSR2 starts as the new supervisor, handing it the sockets (with this run's arguments and environment)"},
		&cli.DurationFlag{Name: "upgrade-timeout", Value: supervisor.DefaultUpgradeTimeout, EnvVars: []string{"SHARDVISOR_UPGRADE_TIMEOUT"},
			Usage: "how long the new supervisor of a SIGUSR2 upgrade has to serve its first generation before it is stopped and this one serves on (`duration`)"},
		&cli.BoolFlag{Name: "example-config", EnvVars: []string{"SHARDVISOR_SUPERVISOR_EXAMPLE_CONFIG"}, Usage: "print an example pool config and exit"},
	)
	return &cli.App{
		Name:  "supervisor",
		Usage: "prefork supervisor: shared sockets, readiness-gated zero-drop worker swaps driven by ZooKeeper",
		Description: "With --zk/--cluster/--pool the pool config and the bucket map come from ZooKeeper; with --config FILE\n" +
			"it runs from a local file and needs no ZooKeeper. Signals: HUP reload, TERM/INT graceful stop, QUIT fast stop,\n" +
			"TTIN/TTOU one worker more/fewer, USR2 upgrade to a new binary without dropping a connection.\n" +
			"One supervisor per pool per host: a second one refuses to start. See docs/supervisor.md.",
		Flags:  flags,
		Action: run,
	}
}

func run(c *cli.Context) error {
	if c.Bool("example-config") {
		fmt.Fprint(c.App.Writer, exampleConfig)
		return nil
	}
	if c.Args().Len() > 0 {
		return cliutil.Usagef("unexpected arguments %q", c.Args().Slice())
	}
	log, err := cliutil.Logger(c)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	if c.String("config") != "" && c.IsSet(cliutil.FlagZK) {
		return cliutil.Usagef("--config runs from a local file without ZooKeeper: give --config or --%s, not both", cliutil.FlagZK)
	}
	for _, f := range []string{"debounce", "holddown"} {
		if d := c.Duration(f); d < 0 {
			return cliutil.Usagef("--%s must not be negative (got %s)", f, d)
		}
	}
	if d := c.Duration("config-poll"); d <= 0 {
		return cliutil.Usagef("--config-poll must be a positive duration, not %s", d)
	}
	if d := c.Duration("upgrade-timeout"); d <= 0 {
		return cliutil.Usagef("--upgrade-timeout must be a positive duration, not %s", d)
	}
	if d := c.Duration("peer-refresh"); d <= 0 {
		return cliutil.Usagef("--peer-refresh must be a positive duration, not %s", d)
	}
	var secret []byte
	if f := c.String("peer-secret-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return cliutil.Usagef("--peer-secret-file: %v", err)
		}
		if secret = []byte(strings.TrimSpace(string(b))); len(secret) < 16 {
			return cliutil.Usagef("--peer-secret-file: %s holds %d bytes of secret, want at least 16", f, len(secret))
		}
	}
	var adminTLS *tls.Config
	var adminTLSClient func(host string) *tls.Config
	if f := (pki.Files{CA: c.String("admin-tls-ca"), Cert: c.String("admin-tls-cert"), Key: c.String("admin-tls-key")}); f != (pki.Files{}) {
		// Read again at each handshake when they change: a rotation
		// needs no restart.
		var err error
		if adminTLS, adminTLSClient, err = f.Reloading(); err != nil {
			return cliutil.Usagef("--admin-tls-ca, --admin-tls-cert, --admin-tls-key: %v", err)
		}
	}
	opts := supervisor.Options{
		Pool:       c.String("pool"),
		Member:     c.String("member"),
		ConfigFile: c.String("config"),
		ConfigPoll: c.Duration("config-poll"),
		StateDir:   c.String("state-dir"),
		AdminAddr:  c.String("admin"),
		AdminTLS:   adminTLS,

		AdminTLSClient: adminTLSClient,
		Debounce:       c.Duration("debounce"),
		Holddown:       c.Duration("holddown"),
		Logger:         log,

		NoFailStatic: !c.Bool("fail-static"),
		PeerSecret:   secret,
		PeerRefresh:  c.Duration("peer-refresh"),

		UpgradeExec:    c.String("upgrade-exec"),
		UpgradeTimeout: c.Duration("upgrade-timeout"),
	}
	if host, _, err := net.SplitHostPort(opts.AdminAddr); err == nil && adminTLS == nil && !loopback(host) {
		log.Warn("the admin endpoints listen off loopback without TLS: every host that reaches them reads /status and /metrics and asks the fail-static question; set --admin-tls-ca, --admin-tls-cert and --admin-tls-key (docs/security.md)", zap.String("admin", opts.AdminAddr))
	}
	if opts.ConfigFile == "" && !opts.NoFailStatic && len(secret) == 0 {
		log.Warn("fail-static peer answers are not authenticated: set --peer-secret-file (see docs/supervisor.md, Fail-static)")
	}
	if opts.ConfigFile == "" {
		// Not waiting for a connection: the supervisor serves nothing
		// until the session is connected, and says so on /healthz.
		s, paths, err := cliutil.Open(c, log)
		if err != nil {
			return err
		}
		defer s.Close()
		opts.Session, opts.Paths = s, paths
	}
	sv, err := supervisor.New(opts)
	if errors.Is(err, supervisor.ErrAlreadyRunning) {
		return err // not a usage error: exit 1
	}
	if err != nil {
		return cliutil.Usagef("%v", err)
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	go func() {
		for {
			select {
			case sig := <-sigs:
				sv.Signal(sig)
			case <-ctx.Done():
				return
			}
		}
	}()
	return sv.Run(ctx)
}

// loopback: host is a loopback address or localhost.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
