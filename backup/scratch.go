package backup

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/hint"
)

// A scratch server: one db node's server recovered from its backups to a
// point, started beside the cluster to read one bucket's rows from, and
// removed afterwards. It must never touch the live cluster:
//
//   - it listens on a unix socket in its own directory only (no TCP);
//   - archive_mode is off (pgbackrest restore --archive-mode=off, and on
//     the command line): its new timeline never reaches the stanza;
//   - no logical replication worker runs (max_logical_replication_workers
//     = 0): a subscription of a move in flight at the point would
//     otherwise connect to the live source and consume its slot.

// DefaultPGBin is where Debian's PostgreSQL 15 keeps pg_ctl.
const DefaultPGBin = "/usr/lib/postgresql/15/bin"

// Scratch is a running scratch server.
type Scratch struct {
	// Dir holds the data directory (Dir/data), the socket and the log.
	Dir    string
	Node   string
	Stanza string
	// Database is the one database restored and served.
	Database string
	// Port is the server's port (its socket's name in Dir, and on
	// 127.0.0.1 when it listens on TCP).
	Port   int
	prefix []string
	pgBin  string
	pid    int
	// Recovered is how long pgBackRest's restore and PostgreSQL's
	// recovery took, together.
	Recovered time.Duration
}

const scratchPort = 5432 // alone in its socket directory: any port will do

// RecoverScratch recovers stanza's server to t into a new directory under
// parent and starts it on a unix socket in that directory only. On failure
// nothing is left running and the directory is removed.
func (b PGBackRest) RecoverScratch(ctx context.Context, parent, pgBin, node, stanza, database string, t Target) (*Scratch, error) {
	return b.RecoverServer(ctx, parent, pgBin, node, stanza, database, t, 0)
}

// RecoverServer is RecoverScratch for a server that also listens on TCP,
// on 127.0.0.1:tcpPort (0: no TCP), taking passwords (scram-sha-256) from
// the roles recovered: a new server for a whole-cluster restore's test.
func (b PGBackRest) RecoverServer(ctx context.Context, parent, pgBin, node, stanza, database string, t Target, tcpPort int) (_ *Scratch, err error) {
	if pgBin == "" {
		pgBin = DefaultPGBin
	}
	start := time.Now()
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	if err := checkParent(parent); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(parent, "scratch-"+node+"-")
	if err != nil {
		return nil, err
	}
	s := &Scratch{Dir: dir, Node: node, Stanza: stanza, Database: database, prefix: b.prefix(), pgBin: pgBin}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	// The directory and everything in it belong to the user pgBackRest
	// runs as: the server refuses a data directory of another owner.
	uid, gid, err := s.owner(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	if err := s.runAs(ctx, "", "test", "-w", dir); err != nil {
		return nil, fmt.Errorf("scratch directory %s cannot be written by the user pgBackRest runs as (%s): each of its parents must be searchable by that user (chmod o+x, or choose another --scratch-dir)", dir, strings.Join(s.prefix, " "))
	}
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o700); err != nil {
		return nil, err
	}
	if err := os.Chown(filepath.Join(dir, "data"), uid, gid); err != nil {
		return nil, err
	}
	var dbs []string
	if database != "" && !systemDatabase(database) {
		dbs = []string{database}
	}
	if err := b.Restore(ctx, stanza, filepath.Join(dir, "data"), t, dbs); err != nil {
		return nil, fmt.Errorf("scratch server for %s: %w", node, err)
	}
	// The server's own hba and TLS files are the live host's: local
	// connections by the scratch's user only.
	hba, listen, port := "local all all trust\n", "''", scratchPort
	if tcpPort > 0 {
		hba += "host all all 127.0.0.1/32 scram-sha-256\n"
		listen, port = "'127.0.0.1'", tcpPort
	}
	s.Port = port
	if err := os.WriteFile(filepath.Join(dir, "hba.conf"), []byte(hba), 0o600); err != nil {
		return nil, err
	}
	if err := os.Chown(filepath.Join(dir, "hba.conf"), uid, gid); err != nil {
		return nil, err
	}
	opts := []string{
		"-c port=" + strconv.Itoa(port), "-c listen_addresses=" + listen, "-c unix_socket_directories='" + dir + "'",
		"-c archive_mode=off", "-c max_logical_replication_workers=0", "-c hba_file='" + filepath.Join(dir, "hba.conf") + "'",
		"-c ssl=off", "-c hot_standby=on", "-c synchronous_standby_names=''", "-c shared_buffers=64MB",
		"-c primary_conninfo=''", "-c primary_slot_name=''", "-c log_line_prefix='%m [%p] '",
	}
	if err := s.runAs(ctx, "", filepath.Join(pgBin, "pg_ctl"), "-D", filepath.Join(dir, "data"), "-l", filepath.Join(dir, "postgres.log"),
		"-o", strings.Join(opts, " "), "-w", "-t", "600", "-s", "start"); err != nil {
		// The directory goes with the failure: say what its log said.
		return nil, startFailed(node, err, tail(filepath.Join(dir, "postgres.log")))
	}
	s.pid = postmasterPid(filepath.Join(dir, "data"))
	// Recovery ends with the promotion at the target; until then the
	// server is read-only and may not have reached it.
	for {
		c, err := s.Connect(ctx)
		if err == nil {
			var inRecovery bool
			err = c.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery)
			c.Close(ctx)
			if err == nil && !inRecovery {
				break
			}
		}
		if s.pid != 0 && syscall.Kill(s.pid, 0) != nil {
			return nil, fmt.Errorf("scratch server for %s stopped during recovery (its log: %s): %s", node, filepath.Join(dir, "postgres.log"), tail(filepath.Join(dir, "postgres.log")))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	s.Recovered = time.Since(start)
	return s, nil
}

// Connect opens a connection to the scratch server's database.
func (s *Scratch) Connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d user=postgres dbname=%s", s.Dir, s.Port, quoteConnValue(s.databaseOr())))
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cfg)
}

func (s *Scratch) databaseOr() string {
	if s.Database == "" {
		return "postgres"
	}
	return s.Database
}

// Close stops the scratch server (immediate: nothing in it is kept) and
// removes its directory. The server's pid is read from its data directory
// every time: a start that failed half way (pg_ctl timed out, the context
// ended) may have left a postmaster behind that RecoverScratch never saw.
// It is stopped with pg_ctl as the server's user (a signal from another
// user would be refused), then by signal, and waited for, before the
// directory goes.
func (s *Scratch) Close() {
	data := filepath.Join(s.Dir, "data")
	pid := postmasterPid(data)
	if pid == 0 {
		pid = s.pid
	}
	if pid != 0 && syscall.Kill(pid, 0) == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = s.runAs(ctx, "", filepath.Join(s.pgBin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "-t", "20", "-s", "stop")
		cancel()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil; time.Sleep(20 * time.Millisecond) {
		}
		if syscall.Kill(pid, 0) == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil; time.Sleep(20 * time.Millisecond) {
			}
		}
	}
	_ = os.RemoveAll(s.Dir)
}

// checkParent refuses a scratch parent directory that someone else could
// tamper with: another user who owns it, or may write to it, could swap a
// scratch directory for a symbolic link before it is given to the server's
// user, or plant a data directory of their own whose rows the restore
// would copy into the live cluster.
func checkParent(parent string) error {
	st, err := os.Lstat(parent)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.IsDir():
		return fmt.Errorf("scratch directory %s is not a directory (a symbolic link?)", parent)
	case ok && int(sys.Uid) != os.Getuid():
		return fmt.Errorf("scratch directory %s belongs to uid %d, not this user (%d): choose another --scratch-dir", parent, sys.Uid, os.Getuid())
	case st.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("scratch directory %s may be written by others (mode %v): chmod go-w it, or choose another --scratch-dir", parent, st.Mode().Perm())
	}
	return nil
}

// owner is the uid and gid the prefix runs as (-1, -1: this process's).
func (s *Scratch) owner(ctx context.Context) (int, int, error) {
	if len(s.prefix) == 0 {
		return -1, -1, nil
	}
	var ids [2]int
	for i, flag := range []string{"-u", "-g"} {
		argv := append(append([]string{}, s.prefix...), "id", flag)
		out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
		if err != nil {
			return 0, 0, fmt.Errorf("scratch: %s: %v", strings.Join(argv, " "), err)
		}
		if ids[i], err = strconv.Atoi(strings.TrimSpace(string(out))); err != nil {
			return 0, 0, fmt.Errorf("scratch: %s printed %q", strings.Join(argv, " "), out)
		}
	}
	return ids[0], ids[1], nil
}

func (s *Scratch) runAs(ctx context.Context, stdin, name string, args ...string) error {
	argv := append(append([]string{}, s.prefix...), name)
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = "/"
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// systemDatabase: pgBackRest restores these always and refuses to be asked.
func systemDatabase(db string) bool {
	return db == "postgres" || db == "template0" || db == "template1"
}

func postmasterPid(data string) int {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// startFailed is a scratch server's failed start, with its log's tail and,
// for the failure that has a known cause, the operator's fix.
func startFailed(node string, err error, log string) error {
	err = fmt.Errorf("scratch server for %s: start: %w; its log: %s", node, err, log)
	if strings.Contains(log, "WAL contains references to invalid pages") {
		return hint.New(err, "the node's server ran with full_page_writes = off: a restore of one database replays WAL over the other databases' zeroed files and needs full-page images; set full_page_writes = on on every db server (shardctl node check reports it) and restore to a time after a backup taken since")
	}
	return err
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	s := strings.TrimSpace(string(b))
	if len(s) > 800 {
		s = "..." + s[len(s)-800:]
	}
	return s
}

func quoteConnValue(s string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}
