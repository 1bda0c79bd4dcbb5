package devenv

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"
)

// PgBouncer (Debian's 1.18) in transaction mode in front of every db
// server, so that thousands of prefork workers share a few dozen server
// connections (issue 42): one per plain node and one per group member, in
// front of that member's own PostgreSQL, each on the server's address at
// the server's port + 2000 (PoolPort, MemberPoolPort), run as the
// postgres user, its files beside the server's (pgbouncer.ini, .auth,
// .log, .pid; templates/pgbouncer.ini.tmpl). A member's Patroni has its
// pooler reconnect when the member's role changes (writeRoleChange).
//
// Authentication: a client logs in with its own role's password (SCRAM),
// and the pooler logs into PostgreSQL as that same role over the server's
// unix socket (trust: no password, no TLS). The verifier it checks the
// client against comes from the server at each login: auth_query, run as
// auth_user postgres through that socket, reads pg_shadow. Not a SECURITY
// DEFINER function for a lesser auth user: PgBouncer 1.18 runs auth_query
// in the database the client asked for (auth_dbname came later), so the
// function would have to be in every database, template1 included, and
// from there in every pg_dump of an application's schema (schema adopt's
// baseline, replayed by node prepare, would create it twice). The pooler
// runs as the OS user that owns the data directory and reaches the trust
// socket anyway: a superuser auth user gives it nothing it lacked. But
// the query runs under the settings of a database other roles may own (a
// search_path ALTER DATABASE set, with functions and operators of their
// own in front of pg_catalog's): every name and operator in it is
// schema-qualified, so nothing but pg_catalog's runs as the superuser
// (CVE-2018-1058's pattern). The
// auth user itself must be in auth_file (1.18 gives an auth user it does
// not find there an empty password, and its own logins fail), as must
// whoever logs into the admin console (an auth_query login there hangs;
// postgres is its admin: SHOW POOLS, SHOW STATS, RECONNECT):
// the file holds postgres and a SCRAM verifier of the environment's
// password, no plaintext (mode 0600, the postgres user's). A role without
// a password (StreamUser) cannot log in through the pooler.
//
// With TLS the pooler takes clients over TLS only (client_tls_sslmode
// require), showing the server's own certificate, so that verify-full
// names match; plain, it takes plain TCP, as the server does.

// pooler is one PgBouncer: in front of a plain node or a group member.
type pooler struct {
	label  string // "pg1", "pg4.m1": its status row is label+".pool"
	server string // the server it fronts: its host (Placement) and certificate, "pg1", "pg4-m1"
	dir    string // its files; also the server's unix socket directory
	port   int
	pgPort int
}

func (e *Env) nodePooler(i int) pooler {
	return pooler{"pg" + itoa(i), "pg" + itoa(i), e.PGDir(i), e.PoolPort(i), e.PGPort(i)}
}

func (e *Env) memberPooler(i, m int) pooler {
	return pooler{fmt.Sprintf("pg%d.m%d", i, m), MemberName(i, m), e.MemberDir(i, m), e.MemberPoolPort(i, m), e.MemberPort(i, m)}
}

// groupPoolers are group i's members' poolers.
func (e *Env) groupPoolers(i int) []pooler {
	n, _, _ := e.recordedMembers(i)
	out := make([]pooler, 0, n)
	for m := 1; m <= n; m++ {
		out = append(out, e.memberPooler(i, m))
	}
	return out
}

func (p pooler) roleChange() string { return filepath.Join(p.dir, "pgbouncer-role-change") }
func (p pooler) ini() string        { return filepath.Join(p.dir, "pgbouncer.ini") }
func (p pooler) authFile() string   { return filepath.Join(p.dir, "pgbouncer.auth") }
func (p pooler) logFile() string    { return filepath.Join(p.dir, "pgbouncer.log") }
func (p pooler) pidFile() string    { return filepath.Join(p.dir, "pgbouncer.pid") }

// poolPid is p's pid if it runs (the pid file's process is a pgbouncer of
// this pgbouncer.ini), else 0.
func (e *Env) poolPid(p pooler) int {
	pid := readPid(p.pidFile())
	if pid == 0 || !Alive(pid, pgbouncerBin+" "+p.ini()) {
		return 0
	}
	return pid
}

// PoolPid is plain node i's PgBouncer pid, 0 if it does not run.
func (e *Env) PoolPid(i int) int { return e.poolPid(e.nodePooler(i)) }

// MemberPoolPid is the pid of member m's PgBouncer in group i, 0 if it
// does not run.
func (e *Env) MemberPoolPid(i, m int) int { return e.poolPid(e.memberPooler(i, m)) }

// poolerIni is p's pgbouncer.ini.
func (e *Env) poolerIni(p pooler) []byte {
	tf := e.TLSFiles(p.server)
	return render("pgbouncer.ini", struct {
		Name, SockDir, Addr, AuthFile string
		Port, PGPort                  int
		TLS                           bool
		CA, Cert, Key                 string
	}{p.server, p.dir, e.addr(p.server), p.authFile(), p.port, p.pgPort, e.c.TLS, tf.CA, tf.Cert, tf.Key})
}

// writeRoleChange writes a group member's Patroni callback (on_start,
// on_role_change; templates/pgbouncer-role-change.tmpl): once the server
// is in its new role, its PgBouncer reconnects. PgBouncer 1.18 sends each
// client the server parameters it cached from its first server
// connection, in_hot_standby among them, which libpq's
// target_session_attrs=read-write reads: without it, a promoted member's
// pooler refused such clients ("session is read-only") until it was
// restarted. It runs as the postgres user, and reads the password file.
func (e *Env) writeRoleChange(p pooler) error {
	mode := "disable"
	if e.c.TLS {
		mode = "require" // verified against ~/.postgresql/root.crt, the CA
	}
	b := render("pgbouncer-role-change", struct {
		Name, PSQL, SockDir, PasswordFile, Addr, SSLMode string
		PGPort, Port                                     int
	}{p.server, filepath.Join(pgBin, "psql"), p.dir, e.PasswordFile(), e.addr(p.server), mode, p.pgPort, p.port})
	if old, err := os.ReadFile(p.roleChange()); err == nil && bytes.Equal(old, b) {
		return nil
	}
	return writeAtomic(p.roleChange(), b, 0o755, nil)
}

// poolFDs is the open-file limit a PgBouncer gets: max_client_conn
// (2000), its server connections and some to spare. It starts with the
// limit this process was started with, often 1024.
const poolFDs = 4096

// poolLaunch starts p's PgBouncer unless it runs, without waiting. One
// that runs with another pgbouncer.ini (an older devenv's, the other
// mode's) is restarted; one whose auth file was rewritten (a new
// password) reloads it (SIGHUP).
func (e *Env) poolLaunch(p pooler, pw string) error {
	name := p.label + ".pool"
	if e.c.TLS {
		if _, err := e.pgServerFiles(p.server); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	ini := e.poolerIni(p)
	authChanged, err := writePoolAuth(p.authFile(), pw)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if pid := e.poolPid(p); pid != 0 {
		if old, err := os.ReadFile(p.ini()); err == nil && bytes.Equal(old, ini) {
			if authChanged {
				e.logf("%s: auth file rewritten; reloading PgBouncer (pid %d)", name, pid)
				_ = syscall.Kill(pid, syscall.SIGHUP)
			}
			return nil
		}
		e.logf("%s: pgbouncer.ini is out of date; restarting PgBouncer with the current one", name)
		e.poolStop(p)
	}
	_ = os.Remove(p.pidFile())
	if !e.portFreed(p.server, p.port, 5*time.Second) {
		return errPortBusy(name, p.port, " (PgBouncer)")
	}
	if err := writePGFile(p.ini(), ini, 0o644); err != nil {
		return err
	}
	log, err := os.OpenFile(p.logFile(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	fmt.Fprintf(log, "=== devenv: starting PgBouncer %s at %s ===\n", name, time.Now().Format("2006-01-02 15:04:05"))
	// It logs to stderr: the log file, which devenv opened.
	cmd := exec.Command(pgbouncerBin, p.ini())
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "HOME=" + p.dir}
	if err := asPG(cmd); err != nil {
		return err
	}
	pid, err := e.startOn(p.server, cmd, log)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	raiseNoFile(pid, poolFDs)
	if err := writePid(p.pidFile(), pid); err != nil {
		return err
	}
	e.logf("%s: PgBouncer started (pid %d, port %d)", name, pid, p.port)
	return nil
}

// raiseNoFile raises process pid's open-file limit to n (not above its
// hard limit unless we are root). Go restores the limit this process
// started with in the processes it starts; PgBouncer reads its limit
// only to log it, and the kernel checks it at each accept.
func raiseNoFile(pid int, n uint64) {
	var cur unix.Rlimit
	if unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &cur) != nil || cur.Cur >= n {
		return
	}
	want := unix.Rlimit{Cur: n, Max: max(cur.Max, n)}
	if !isRoot() {
		want = unix.Rlimit{Cur: min(n, cur.Max), Max: cur.Max}
	}
	_ = unix.Prlimit(pid, unix.RLIMIT_NOFILE, &want, nil)
}

// poolStop stops p's PgBouncer (SIGTERM: at once, its clients cut).
func (e *Env) poolStop(p pooler) {
	if pid := e.poolPid(p); pid != 0 {
		e.stopPid(p.label+".pool", pid, 10*time.Second)
		e.logf("%s.pool: PgBouncer stopped (pid %d)", p.label, pid)
	}
	_ = os.Remove(p.pidFile())
}

// poolKill SIGKILLs p's PgBouncer (its host dies: PGKill of a group) and
// returns once it is dead.
func (e *Env) poolKill(p pooler) {
	if pid := e.poolPid(p); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		waitGone(pid)
	}
	_ = os.Remove(p.pidFile())
}

// poolReload makes p's PgBouncer read its files again (SIGHUP): its TLS
// certificate and key for new connections, its auth file.
func (e *Env) poolReload(p pooler) error {
	if pid := e.poolPid(p); pid != 0 {
		if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
			return fmt.Errorf("%s.pool: reload: %w", p.label, err)
		}
	}
	return nil
}

// poolLogin logs in through p as postgres (over TLS with TLS: a probe,
// sslmode=require) and runs a query: the pooler serves and reaches its
// server.
func (e *Env) poolLogin(p pooler, password string) error {
	mode := "disable"
	if e.c.TLS {
		mode = "require"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=%s connect_timeout=3", e.addr(p.server), p.port, mode))
	if err != nil {
		return err
	}
	cfg.Password = password
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "SELECT 1").ReadAll()
	return err
}

// poolState is p's status word: stopped, not-accepting or accepting (a
// login through it works).
func (e *Env) poolState(p pooler, password string) (pid int, state string) {
	if pid = e.poolPid(p); pid == 0 {
		return 0, "stopped"
	}
	if e.poolLogin(p, password) != nil {
		return pid, "not-accepting"
	}
	return pid, "accepting"
}

// waitPoolers waits until a login through each pooler works; one whose
// process is gone fails at once, with its log's tail.
func (e *Env) waitPoolers(deadline time.Time, ps ...pooler) error {
	pw := e.Password()
	since := time.Now()
	for {
		var errs []error
		for _, p := range ps {
			if e.poolPid(p) == 0 {
				return withLogs(fmt.Errorf("%s.pool: PgBouncer is not running", p.label), p.logFile())
			}
			if err := e.poolLogin(p, pw); err != nil {
				errs = append(errs, withLogs(fmt.Errorf("%s.pool: no login through PgBouncer on port %d after %ds: %w", p.label, p.port, int(time.Since(since).Seconds()), err), p.logFile()))
			}
		}
		if len(errs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(errs...)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// scramIterations is PostgreSQL's default (scram_iterations).
const scramIterations = 4096

// scramVerifier is password's SCRAM-SHA-256 secret as PostgreSQL stores
// it in pg_authid and PgBouncer reads it in an auth file (RFC 5803):
// SCRAM-SHA-256$ITERATIONS:SALT$STOREDKEY:SERVERKEY. The password is
// taken as it is (SASLprep leaves the environment's, letters and digits,
// unchanged).
func scramVerifier(password string, salt []byte, iterations int) (string, error) {
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", err
	}
	mac := func(msg string) []byte {
		h := hmac.New(sha256.New, salted)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	stored := sha256.Sum256(mac("Client Key"))
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(stored[:]), b64(mac("Server Key"))), nil
}

// scramVerifies reports whether verifier is one of password.
func scramVerifies(verifier, password string) bool {
	rest, ok := strings.CutPrefix(verifier, "SCRAM-SHA-256$")
	if !ok {
		return false
	}
	params, _, ok := strings.Cut(rest, "$")
	if !ok {
		return false
	}
	iter, saltB64, ok := strings.Cut(params, ":")
	if !ok {
		return false
	}
	n, err := strconv.Atoi(iter)
	salt, err2 := base64.StdEncoding.DecodeString(saltB64)
	if err != nil || err2 != nil || n <= 0 {
		return false
	}
	v, err := scramVerifier(password, salt, n)
	return err == nil && hmac.Equal([]byte(v), []byte(verifier))
}

// poolAuthLine is the auth file's line for postgres.
func poolAuthLine(verifier string) string { return `"postgres" "` + verifier + `"` + "\n" }

// writePoolAuth writes a pooler's auth file: postgres with a verifier of
// password. A file that already verifies it is kept (changed false), so
// that a running pooler need not reload.
func writePoolAuth(path, password string) (changed bool, err error) {
	if b, err := os.ReadFile(path); err == nil {
		f := strings.Fields(string(b))
		if len(f) == 2 && f[0] == `"postgres"` && scramVerifies(strings.Trim(f[1], `"`), password) {
			return false, nil
		}
	}
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return false, err
	}
	v, err := scramVerifier(password, salt, scramIterations)
	if err != nil {
		return false, err
	}
	tmp := path + ".tmp"
	if err := writePGFile(tmp, []byte(poolAuthLine(v)), 0o600); err != nil {
		return false, err
	}
	return true, os.Rename(tmp, path)
}
