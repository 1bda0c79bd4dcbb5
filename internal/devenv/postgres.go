package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Plain PostgreSQL 15 nodes: one postmaster each, data in pg/pgI/data,
// started and stopped with pg_ctl as the postgres user. Authentication:
// trust over the unix socket in pg/pgI/, scram-sha-256 over TCP
// (replication too), user postgres.

// Password is the postgres superuser's password ("" if none yet).
func (e *Env) Password() string {
	b, err := os.ReadFile(e.PasswordFile())
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return line
}

// ensurePassword creates the password file if needed (changed: it was
// created now, so existing servers must be told) and rewrites pgpass.
func (e *Env) ensurePassword() (pw string, changed bool, err error) {
	dir := filepath.Join(e.c.Dir, "pg")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, err
	}
	_ = os.Chmod(dir, 0o755)
	if pw = e.Password(); pw == "" {
		pw, changed = randomPassword(), true
		if err := os.WriteFile(e.PasswordFile(), []byte(pw+"\n"), 0o644); err != nil {
			return "", false, err
		}
		_ = os.Chmod(e.PasswordFile(), 0o644)
	}
	// libpq ignores a password file that is not 0600.
	tmp := e.PGPassFile() + ".tmp"
	body := fmt.Sprintf("127.0.0.1:*:*:postgres:%s\nlocalhost:*:*:postgres:%s\n", pw, pw)
	for i := 1; e.c.Hosts != nil && i <= 9; i++ { // the servers' hosts' addresses, no wildcard
		for _, name := range append([]string{"pg" + itoa(i)}, memberNames(i)...) {
			if a := e.c.Hosts.Addr(name); a != "" {
				body += fmt.Sprintf("%s:*:*:postgres:%s\n", a, pw)
			}
		}
	}
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		return "", false, err
	}
	_ = os.Chmod(tmp, 0o600)
	return pw, changed, os.Rename(tmp, e.PGPassFile())
}

// pgPid is plain node i's postmaster pid if it runs, else 0.
func (e *Env) pgPid(i int) int { return postmasterPid(e.pgData(i)) }

// pgStaleBinary: the running postmaster's executable was replaced on disk
// (postgresql-15 upgraded by apt): it would load the new version's
// libraries, which fails (e.g. logical replication's libpqwalreceiver).
func (e *Env) pgStaleBinary(i int) bool {
	pid := e.pgPid(i)
	if pid == 0 {
		return false
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return err == nil && strings.HasSuffix(exe, " (deleted)")
}

// pgReady reports whether the server on port accepts connections, as
// pg_isready does: it answers a startup packet with anything but "the
// database system is starting up / shutting down" (57P03). A refused
// password counts as accepting.
// With TLS it asks over TLS (sslmode=require: a probe, nothing to
// verify), so that not even its startup packet crosses a network in clear.
func pgReady(addr string, port int, password string, tls bool) bool {
	mode := "disable"
	if tls {
		mode = "require"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=%s connect_timeout=2", addr, port, mode))
	if err != nil {
		return false
	}
	cfg.Password = password
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err == nil {
		c.Close(ctx)
		return true
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code != "57P03"
}

func (e *Env) pgInit(i int) error {
	dir := e.PGDir(i)
	if fileExists(filepath.Join(dir, "data", "PG_VERSION")) {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := chownPG(dir); err != nil {
		return err
	}
	_ = os.Chmod(dir, 0o755)
	_ = os.RemoveAll(e.pgData(i))
	e.logf("pg%d: initdb", i)
	if err := runPG(filepath.Join(dir, "initdb.log"), filepath.Join(pgBin, "initdb"), "-D", e.pgData(i), "-U", "postgres", "-N",
		"--auth-local=trust", "--auth-host=scram-sha-256", "--pwfile="+e.PasswordFile(), "--no-locale", "--encoding=UTF8"); err != nil {
		return withLogs(fmt.Errorf("pg%d: initdb failed: %w", i, err), filepath.Join(dir, "initdb.log"))
	}
	hba := filepath.Join(e.pgData(i), "pg_hba.conf")
	b, err := os.ReadFile(hba)
	if err != nil {
		return err
	}
	if !hasReplicationLine(string(b), e.clientCIDR()) {
		if err := appendFile(hba, "host    replication     all             "+e.clientCIDR()+"            scram-sha-256\n"); err != nil {
			return err
		}
	}
	return appendFile(filepath.Join(e.pgData(i), "postgresql.conf"), "include_if_exists = 'shardvisor.conf'\n")
}

// hasReplicationLine: pg_hba.conf lets replication connections in over TCP
// from 127.0.0.1 with a password.
func hasReplicationLine(hba, cidr string) bool {
	for _, l := range strings.Split(hba, "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && f[0] == "host" && f[1] == "replication" && f[2] == "all" && f[3] == cidr && f[4] == "scram-sha-256" {
			return true
		}
	}
	return false
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writePGFile writes a file the postgres user owns.
func writePGFile(path string, b []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, b, mode); err != nil {
		return err
	}
	_ = os.Chmod(path, mode)
	return chownPG(path)
}

// pgLaunch initialises node i if needed and starts it without waiting.
func (e *Env) pgLaunch(i int) error {
	if err := e.pgInit(i); err != nil {
		return err
	}
	if e.pgStaleBinary(i) {
		e.logf("pg%d: running an upgraded-away postgres binary; restarting it", i)
		e.pgStop(i)
	}
	if pid := e.pgPid(i); pid != 0 && procHome(pid) != "" && procHome(pid) != e.PGDir(i) {
		// Started by an older devenv with the postgres user's HOME: its
		// libpq would not find the node's client certificate.
		e.logf("pg%d: running with HOME %s, not its own; restarting it", i, procHome(pid))
		e.pgStop(i)
	}
	if e.pgPid(i) != 0 && e.pgConfStale(i) {
		// Started by an older devenv: without WAL archiving, say
		// (archive_mode takes a restart).
		e.logf("pg%d: shardvisor.conf is out of date; restarting it with the current one", i)
		e.pgStop(i)
	}
	if e.pgPid(i) != 0 {
		return nil
	}
	if e.portBusy("pg"+itoa(i), e.PGPort(i)) {
		return errPortBusy(fmt.Sprintf("pg%d", i), e.PGPort(i), "")
	}
	if e.c.TLS {
		if err := e.pgWriteTLS(i); err != nil {
			return fmt.Errorf("pg%d: %w", i, err)
		}
	}
	if err := writePGFile(filepath.Join(e.pgData(i), "shardvisor.conf"), e.shardvisorConf(i), 0o644); err != nil {
		return err
	}
	waitReaped(e.pgData(i))
	// postgres removes a stale postmaster.pid by itself.
	// HOME is the node's directory: its libpq (a subscription's) takes
	// the node's client certificate from ~/.postgresql (pgWriteTLS).
	cmd := exec.Command(filepath.Join(pgBin, "pg_ctl"), "-D", e.pgData(i), "-l", e.pgLog(i), "-W", "-s", "start")
	cmd.Env = append(os.Environ(), "HOME="+e.PGDir(i))
	if err := asPG(cmd); err != nil {
		return err
	}
	if err := e.runOn("pg"+itoa(i), cmd); err != nil {
		return withLogs(fmt.Errorf("pg%d: pg_ctl start failed: %w", i, err), e.pgLog(i))
	}
	e.logf("pg%d: starting (port %d)", i, e.PGPort(i))
	return nil
}

// pgConfStale reports whether plain node i's shardvisor.conf, written
// when it started, differs from the one rendered now.
func (e *Env) pgConfStale(i int) bool {
	b, err := os.ReadFile(filepath.Join(e.pgData(i), "shardvisor.conf"))
	return err == nil && string(b) != string(e.shardvisorConf(i))
}

// pgCtlStop stops the postmaster of data (fast shutdown), signalling it
// if pg_ctl cannot.
func (e *Env) pgCtlStop(name, data string, pid int) {
	if err := runPG("", filepath.Join(pgBin, "pg_ctl"), "-D", data, "-m", "fast", "-w", "-t", "30", "-s", "stop"); err != nil {
		e.logf("%s: pg_ctl stop failed, signalling pid %d", name, pid)
		_ = syscall.Kill(pid, syscall.SIGQUIT)
		e.stopPid(name, pid, 10*time.Second)
	}
}

// pgStop stops plain node i's PgBouncer, then its postmaster.
func (e *Env) pgStop(i int) {
	e.poolStop(e.nodePooler(i))
	pid := e.pgPid(i)
	if pid == 0 {
		return
	}
	e.pgCtlStop(fmt.Sprintf("pg%d", i), e.pgData(i), pid)
	e.logf("pg%d: stopped (pid %d)", i, pid)
}

// waitReaped: if the postmaster named in DATA/postmaster.pid is dead but
// not yet reaped (a zombie: a killed postmaster's parent is init, which may
// take a second or more), wait until it is, at most 5 s: a new postmaster
// refuses to start while that pid exists.
func waitReaped(data string) {
	pid := readPid(filepath.Join(data, "postmaster.pid"))
	if pid == 0 {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for procState(pid) == 'Z' && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

// killPostmasterTree stops the postmaster (so it forks no more) and the
// extra processes, then SIGKILLs them and every child of the postmaster
// in one go. It returns the number of children.
func killPostmasterTree(pm int, extra ...int) int {
	all := append([]int{pm}, extra...)
	for _, p := range all {
		_ = syscall.Kill(p, syscall.SIGSTOP)
	}
	kids := childrenOf(pm)
	for _, p := range append(all, kids...) {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	return len(kids)
}

// setPassword sets the postgres role's password to the password file's,
// over the unix socket in sockDir (trust).
func setPassword(sockDir string, port int, pw string) error {
	return execLocal(sockDir, port, "ALTER ROLE postgres PASSWORD '"+strings.ReplaceAll(pw, "'", "''")+"'")
}

// execLocal runs sql as the postgres user on the server whose unix socket
// is in sockDir (trust: no password, no TLS).
func execLocal(sockDir string, port int, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", sockDir, port))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, sql)
	return err
}

// queryLocal runs sql as the postgres user on the server whose unix
// socket is in sockDir and returns the first column of its first row.
func queryLocal(sockDir string, port int, sql string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", sockDir, port))
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	var v string
	err = c.QueryRow(ctx, sql).Scan(&v)
	return v, err
}

// procHome is process pid's HOME ("" if it cannot be read).
func procHome(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return ""
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, "HOME="); ok {
			return v
		}
	}
	return ""
}

// pgAfterStart brings running plain node i up to date: with TLS its
// certificate files, pg_hba and pg_ident written again and reloaded (a
// node started by an older devenv gets the stream user's cert line), and
// the stream user created.
func (e *Env) pgAfterStart(i int) error {
	if e.c.TLS && e.pgConfTLS(i) {
		if err := e.pgWriteTLS(i); err != nil {
			return err
		}
		if err := pgReload(e.PGDir(i), e.PGPort(i)); err != nil {
			return err
		}
	}
	return ensureStreamUser(e.PGDir(i), e.PGPort(i))
}

// pgReload makes the server whose unix socket is in sockDir read its
// configuration files again: pg_hba, pg_ident, and the TLS files (the
// server certificate, key and CA; connections open keep theirs).
func pgReload(sockDir string, port int) error {
	return execLocal(sockDir, port, "SELECT pg_reload_conf()")
}
