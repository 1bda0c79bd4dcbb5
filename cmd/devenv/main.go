// Command devenv is a throwaway local environment for shardvisor
// development and tests: a 3-node ZooKeeper 3.8 ensemble and N PostgreSQL
// 15 nodes, all on 127.0.0.1, all state under one directory. A node is a
// plain PostgreSQL server or a Patroni group (primary + synchronous
// standbys, its DCS on this ensemble). scripts/devenv builds and runs it;
// internal/devenv does the work, and tests and benches call it in-process.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/devenv"
)

func main() {
	cliutil.Run(newApp())
}

func newApp() *cli.App {
	return &cli.App{
		Name:  "devenv",
		Usage: "a throwaway ZooKeeper ensemble and PostgreSQL nodes (plain or Patroni groups) on 127.0.0.1",
		Description: "All state lives under --dir:\n" +
			"  zk/zkI/{zoo.cfg,log4j.properties,zk.pid,zookeeper.log,zookeeper.out,data/,datalog/}\n" +
			"  zk/superpass  password of the ZooKeeper superuser: addauth digest super:PASSWORD\n" +
			"  pg/password   the postgres superuser password (mode 0644: throwaway env!)\n" +
			"  pg/pgpass     the same as a libpq/pgx password file (mode 0600)\n" +
			"  pg/pgI/{data/,postgres.log}   a plain node\n" +
			"  pg/pgI/members                a group: its number of members\n" +
			"  pg/pgI/mM/{data/,patroni.yml,patroni.log,postgres.log,patroni.pid,pgpass,zkfwdJ.pid}\n" +
			"  pg/pgI/[mM/]pgbouncer.{ini,auth,log,pid}  the server's PgBouncer\n" +
			"  backup/pgbackrest.conf  pgBackRest's configuration (a stanza per node, pgI: a group's lists every member)\n" +
			"  backup/{repo/,log/,lock/,spool/}  its repository, into which every db server archives its WAL\n" +
			"PostgreSQL authentication: trust over the unix socket in pg/pgI/ (pg/pgI/mM/), scram-sha-256\n" +
			"over TCP (replication too), user postgres. A group's env DSN lists every member with\n" +
			"target_session_attrs=read-write, so it reaches the current primary.\n" +
			"Every db server has a PgBouncer in transaction mode at its port + 2000 (status rows pgI.pool,\n" +
			"pgI.mM.pool; env's SHARDVISOR_PGI_POOL_DSN): any role with a password logs in with it, and\n" +
			"the pooler logs into the server as that role over its unix socket.\n" +
			"Every db server archives its WAL into the pgBackRest repository (archive_timeout 60s); up makes\n" +
			"each node's stanza. env's SHARDVISOR_PGBACKREST (the command: as root, as the postgres user) and\n" +
			"SHARDVISOR_PGBACKREST_CONFIG run pgbackrest on it: $SHARDVISOR_PGBACKREST --config=$SHARDVISOR_PGBACKREST_CONFIG --stanza=pg1 backup.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dir", Value: devenv.DefaultDir, EnvVars: []string{"SHARDVISOR_DEVENV_DIR"},
				Usage: "state `directory` (must be traversable by the postgres user)"},
			&cli.IntFlag{Name: "zk-port-base", Value: devenv.DefaultZKPortBase, EnvVars: []string{"SHARDVISOR_ZK_PORT_BASE"},
				Usage: "first ZooKeeper client `port`: server i (1..3) listens on BASE+i-1 for clients, BASE+1070+i-1 for quorum, BASE+2070+i-1 for election"},
			&cli.IntFlag{Name: "pg-port-base", Value: devenv.DefaultPGPortBase, EnvVars: []string{"SHARDVISOR_PG_PORT_BASE"},
				Usage: "first PostgreSQL `port`: node i listens on BASE+i-1; member m of group i on BASE+(i-1)+100*(m-1), its Patroni REST API on BASE+1000+(i-1)+100*(m-1); each server's PgBouncer 2000 above the server"},
			&cli.StringFlag{Name: "pg-nodes", EnvVars: []string{"SHARDVISOR_PG_NODES"},
				Usage: "`number` of PostgreSQL nodes up ensures (default: 3, or more if more node directories exist)"},
			&cli.StringFlag{Name: "pg-ha", EnvVars: []string{"SHARDVISOR_PG_HA"},
				Usage: "members (1..9) per node that up creates; more than 1: a Patroni group, scope pgI, namespace /service/, members pgI-m1..pgI-mN, synchronous_mode on. A node's kind is fixed when it is created: unset, existing nodes keep theirs"},
			&cli.StringFlag{Name: "pg-ha-nodes", EnvVars: []string{"SHARDVISOR_PG_HA_NODES"},
				Usage: "comma `list` of the node numbers --pg-ha applies to (default: all); the others are plain"},
			&cli.BoolFlag{Name: "tls", Value: true, EnvVars: []string{"SHARDVISOR_DEVENV_TLS"},
				Usage: "ZooKeeper takes clients over TLS only, each identified by its certificate (x509 ACLs), and runs its quorum over TLS; Patroni's records are its own, its REST API HTTPS; PostgreSQL takes TCP over TLS only (a certificate of the CA per server) and the DSNs env prints verify it (sslmode=verify-full); the CA and certificates are made in DIR/tls on the first up; env exports the admin's. --tls=false (SHARDVISOR_DEVENV_TLS=0) or --plain: everything plain and open, as the tests' clients need"},
			&cli.BoolFlag{Name: "plain", EnvVars: []string{"SHARDVISOR_DEVENV_PLAIN"},
				Usage: "the plain mode: --tls=false. up and run restart servers running in the other mode; the other commands act on whatever runs"},
			&cli.BoolFlag{Name: "zk-full-jit", EnvVars: []string{"SHARDVISOR_DEVENV_ZK_FULL_JIT"},
				Usage: "run ZooKeeper's JVM with C2, as production does (for benchmarks of steady-state latency, over TLS above all: C1 alone, the default, starts faster but encrypts without the CPU's AES instructions); servers already running keep theirs"},
			&cli.IntFlag{Name: "timeout", Value: int(devenv.DefaultTimeout / time.Second), EnvVars: []string{"SHARDVISOR_DEVENV_TIMEOUT"},
				Usage: "`seconds` to wait for health"},
		},
		Commands: []*cli.Command{
			{Name: "up", Usage: "start everything that is not running and wait until healthy (idempotent); servers running in the other mode (--tls, --plain) are restarted in this one", Action: up},
			{Name: "down", Usage: "stop everything devenv started (by pid files)", Action: with(func(e *devenv.Env, _ *cli.Context) error { return e.Down() })},
			{Name: "status", Usage: "one line per server (per member for a group); exit status 1 if anything is down or a group has no leader", Action: status},
			{Name: "env", Usage: "print export lines with the connect strings (eval \"$(scripts/devenv env)\")", Action: with(func(e *devenv.Env, _ *cli.Context) error { e.Exports(os.Stdout); return nil })},
			{Name: "logs", Usage: "list the log files, or show the tail of one (zk1, pg2, pg4.m1: a member's Patroni and PostgreSQL logs, pg4: all members', pg2.pool, pg4.m1.pool: a PgBouncer's)", ArgsUsage: "[NAME]",
				Action: with(func(e *devenv.Env, c *cli.Context) error { return e.Logs(os.Stdout, c.Args().First()) })},
			zkCmd("zk-start", "start ZooKeeper server N; waits until it serves when a quorum can exist, else until it listens", (*devenv.Env).ZKStart),
			zkCmd("zk-stop", "stop ZooKeeper server N (SIGTERM)", (*devenv.Env).ZKStop),
			zkCmd("zk-kill", "SIGKILL ZooKeeper server N", (*devenv.Env).ZKKill),
			zkCmd("zk-freeze", "SIGSTOP ZooKeeper server N (it answers nothing until zk-thaw or up)", (*devenv.Env).ZKFreeze),
			zkCmd("zk-thaw", "SIGCONT ZooKeeper server N after zk-freeze", (*devenv.Env).ZKThaw),
			{Name: "pg-start", Usage: "start PostgreSQL node N; for a group, every member that is not running (it rejoins as a standby), and wait until all stream", ArgsUsage: "N",
				Action: with(pgStart)},
			{Name: "pg-stop", Usage: "stop PostgreSQL node N (all members of a group) and its PgBouncer", ArgsUsage: "N",
				Action: with(func(e *devenv.Env, c *cli.Context) error { return nodeDo(c, e.PGStop) })},
			{Name: "pg-kill", Usage: "SIGKILL node N's postmaster and all its children at once; for a group, those of its current primary and its Patroni and PgBouncer too; prints which member died", ArgsUsage: "N",
				Action: with(pgKill)},
			{Name: "pg-primary", Usage: "print the current primary member of group N: NAME PORT", ArgsUsage: "N", Action: with(pgPrimary)},
			memberCmd("zk-cut", "cut member M of group N off from ZooKeeper (its forwarders stop, with every connection through them)", (*devenv.Env).ZKCut),
			memberCmd("zk-heal", "let member M of group N reach ZooKeeper again", (*devenv.Env).ZKHeal),
			{Name: "rotate-certs", Usage: "issue every certificate in DIR/tls again (a new key and serial, the same names) and make the servers use them: PostgreSQL and Patroni reload (SIGHUP), ZooKeeper restarts one server at a time (3.8 cannot reload its client port's certificate); clients read theirs at each new connection",
				Flags: []cli.Flag{&cli.BoolFlag{Name: "ca", EnvVars: []string{"SHARDVISOR_DEVENV_ROTATE_CA"},
					Usage: "a new CA signs them; ca.crt holds the new CA and the previous one, trusted everywhere before a certificate of the new CA is shown"}},
				Action: with(func(e *devenv.Env, c *cli.Context) error { return e.RotateTLS(c.Bool("ca")) })},
			{Name: "run", Usage: "run a command with the environment up; stop it afterwards if this started it (not with --keep)", ArgsUsage: "-- COMMAND [ARG...]",
				Flags:  []cli.Flag{&cli.BoolFlag{Name: "keep", EnvVars: []string{"KEEP"}, Usage: "leave an environment this started running"}},
				Action: run},
		},
	}
}

// envOf is the environment the flags describe, in the mode they ask for
// (up and run make it so); the other commands use envRunning.
func envOf(c *cli.Context) (*devenv.Env, error) {
	tls, err := tlsMode(c)
	if err != nil {
		return nil, err
	}
	cfg := devenv.Config{Dir: c.String("dir"), ZKPortBase: c.Int("zk-port-base"), PGPortBase: c.Int("pg-port-base"),
		TLS: tls, ZKFullJIT: c.Bool("zk-full-jit"), Timeout: time.Duration(c.Int("timeout")) * time.Second, Log: os.Stderr}
	if cfg.PGNodes, err = devenv.ParseNodes(c.String("pg-nodes")); err != nil {
		return nil, err
	}
	if cfg.HA, err = devenv.ParseHA(c.String("pg-ha")); err != nil {
		return nil, err
	}
	if cfg.HANodes, err = devenv.ParseHANodes(c.String("pg-ha-nodes")); err != nil {
		return nil, err
	}
	return devenv.New(cfg), nil
}

// tlsMode is the mode asked: TLS unless --plain or --tls=false.
func tlsMode(c *cli.Context) (bool, error) {
	if c.Bool("plain") && c.IsSet("tls") && c.Bool("tls") {
		return false, cliutil.Usagef("--plain and --tls (SHARDVISOR_DEVENV_PLAIN, SHARDVISOR_DEVENV_TLS) ask for both modes: give one")
	}
	return c.Bool("tls") && !c.Bool("plain"), nil
}

// envRunning is envOf in the mode the running ensemble has, if one runs:
// status, a fault or a start acts on the environment as it is (make test
// runs a plain one under a TLS default).
func envRunning(c *cli.Context) (*devenv.Env, error) {
	e, err := envOf(c)
	if err != nil {
		return nil, err
	}
	if tls, ok := e.RunningTLS(); ok && tls != e.Config().TLS {
		cfg := e.Config()
		cfg.TLS = tls
		e = devenv.New(cfg)
	}
	return e, nil
}

func with(f func(*devenv.Env, *cli.Context) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		e, err := envRunning(c)
		if err != nil {
			return err
		}
		return f(e, c)
	}
}

// argNum is argument k, a positive number.
func argNum(c *cli.Context, k int, what string) (int, error) {
	s := c.Args().Get(k)
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || s[0] == '0' || s[0] == '+' {
		return 0, fmt.Errorf("expected a %s, got '%s'", what, s)
	}
	return n, nil
}

func nodeDo(c *cli.Context, f func(int) error) error {
	n, err := argNum(c, 0, "node number")
	if err != nil {
		return err
	}
	return f(n)
}

func zkCmd(name, usage string, f func(*devenv.Env, int) error) *cli.Command {
	return &cli.Command{Name: name, Usage: usage, ArgsUsage: "N",
		Action: with(func(e *devenv.Env, c *cli.Context) error {
			return nodeDo(c, func(i int) error { return f(e, i) })
		})}
}

func memberCmd(name, usage string, f func(*devenv.Env, int, int) error) *cli.Command {
	return &cli.Command{Name: name, Usage: usage, ArgsUsage: "N M",
		Action: with(func(e *devenv.Env, c *cli.Context) error {
			i, err := argNum(c, 0, "node number")
			if err != nil {
				return err
			}
			m, err := argNum(c, 1, "member number")
			if err != nil {
				return err
			}
			return f(e, i, m)
		})}
}

func up(c *cli.Context) error {
	start := time.Now()
	e, err := envOf(c)
	if err != nil {
		return err
	}
	if err := e.Up(); err != nil {
		return err
	}
	e.Status(os.Stdout)
	e.Summary(os.Stdout)
	d := time.Since(start)
	fmt.Printf("up in %d.%01ds; state in %s\n", d/time.Second, d%time.Second/(100*time.Millisecond), e.Dir())
	return nil
}

// status exits 1 when the environment is not healthy, with nothing on
// stderr: the table says what.
func status(c *cli.Context) error {
	e, err := envRunning(c)
	if err != nil {
		return err
	}
	if !e.Status(os.Stdout) {
		os.Exit(cliutil.ExitFailure)
	}
	return nil
}

func pgStart(e *devenv.Env, c *cli.Context) error {
	return nodeDo(c, func(i int) error {
		if err := e.PGStart(i); err != nil {
			return err
		}
		if e.IsGroup(i) {
			e.GroupStatus(os.Stdout, i)
		}
		return nil
	})
}

func pgKill(e *devenv.Env, c *cli.Context) error {
	return nodeDo(c, func(i int) error {
		k, err := e.PGKill(i)
		if err != nil {
			return err
		}
		fmt.Println(k)
		return nil
	})
}

func pgPrimary(e *devenv.Env, c *cli.Context) error {
	return nodeDo(c, func(i int) error {
		name, port, ok, err := e.Primary(i)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("pg%d: no member is primary right now", i)
		}
		fmt.Println(name, port)
		return nil
	})
}

// run runs a command with the environment up. If it was already up, it
// stays up; if this started it, it is stopped afterwards (by pid, as down
// does), whatever the command's outcome. An environment that is partly up
// (a test of another process killed a ZooKeeper server for a moment) is
// brought up but not stopped afterwards: it is not ours. The command's
// exit status is kept.
func run(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		return cliutil.Usagef("run needs a command: devenv run -- COMMAND [ARG...]")
	}
	e, err := envOf(c)
	if err != nil {
		return err
	}
	started := false
	// Without pgBackRest's configuration, servers an older devenv started
	// do not archive their WAL: up restarts them with it.
	if _, err := os.Stat(e.BackupConfig()); err != nil || !e.Status(io.Discard) {
		started = !e.AnythingRunning()
		if err := e.Up(); err != nil {
			return err
		}
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// The command's own devenv calls (a test's pg-kill) and testenv see
	// the mode this ran.
	mode := "0"
	if e.Config().TLS {
		mode = "1"
	}
	cmd.Env = append(os.Environ(), "SHARDVISOR_DEVENV_TLS="+mode, "SHARDVISOR_DEVENV_PLAIN=")
	// A Ctrl-C reaches the command from the terminal; a signal sent to
	// this process alone is passed on. Either way the cleanup runs.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	code := 0
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "devenv: %v\n", err)
		code = 127
	} else {
		go func() {
			for s := range sigs {
				if s == syscall.SIGTERM {
					_ = cmd.Process.Signal(s)
				}
			}
		}()
		err := cmd.Wait()
		var xe *exec.ExitError
		switch {
		case errors.As(err, &xe) && xe.Exited():
			code = xe.ExitCode()
		case errors.As(err, &xe):
			code = 128 + int(xe.Sys().(syscall.WaitStatus).Signal())
		case err != nil:
			code = 1
		}
	}
	if started && !c.Bool("keep") {
		if err := e.Down(); err != nil {
			fmt.Fprintf(os.Stderr, "devenv: down: %v\n", err)
		}
	}
	os.Exit(code)
	return nil
}
