package devenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Alive reports whether pid is a live process, not a zombie, whose command
// line contains pattern (if not empty): a pid file's pid that was reused by
// another process does not count.
func Alive(pid int, pattern string) bool {
	st := procState(pid)
	if st == 0 || st == 'Z' {
		return false
	}
	if pattern == "" {
		return true
	}
	cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	if len(cmd) == 0 {
		// A process just started: exec has closed its close-on-exec
		// files (so exec.Cmd.Start has returned) but the kernel has not
		// yet set up its arguments. Read as "exited", this failed a
		// demo's start ("process 0 exited before creating .../initialize").
		return true
	}
	return strings.Contains(strings.ReplaceAll(string(cmd), "\x00", " "), pattern)
}

// procState is the state letter of /proc/PID/stat (R, S, T, Z...), 0 if
// there is no such process.
func procState(pid int) byte {
	f := procStat(pid)
	if len(f) < 1 || len(f[0]) == 0 {
		return 0
	}
	return f[0][0]
}

// allThreadsStopped reports whether every thread of pid sits stopped
// ('T'). kill(SIGSTOP) returns once the signal is queued; a thread that
// already runs (a JVM's selector answering a four-letter word) goes on
// until one thread takes the signal and stops the rest, which on a busy
// machine takes a scheduling round or more.
func allThreadsStopped(pid int) bool {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + t.Name() + "/stat")
		if err != nil {
			continue // the thread exited
		}
		s := string(b)
		i := strings.LastIndex(s, ") ")
		if i < 0 || i+2 >= len(s) || s[i+2] != 'T' {
			return false
		}
	}
	return true
}

// WaitStopped waits up to timeout until every thread of pid sits stopped
// after a SIGSTOP, and reports whether they do.
func WaitStopped(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for !allThreadsStopped(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// procStat is /proc/PID/stat's fields after the command name: state,
// ppid, ...
func procStat(pid int) []string {
	if pid <= 0 {
		return nil
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndex(s, ") ")
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+2:])
}

// readPid reads the first line of a pid file (a postmaster.pid too).
func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

func writePid(path string, pid int) error {
	return os.WriteFile(path, []byte(strconv.Itoa(pid)+"\n"), 0o644)
}

// postmasterPid is the pid in DATA/postmaster.pid if that process runs
// and is a postgres.
func postmasterPid(data string) int {
	pid := readPid(data + "/postmaster.pid")
	if pid == 0 || !Alive(pid, "") {
		return 0
	}
	if comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); err != nil || strings.TrimSpace(string(comm)) != "postgres" {
		return 0
	}
	return pid
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	want := strconv.Itoa(pid)
	for _, d := range entries {
		c, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if f := procStat(c); len(f) > 1 && f[1] == want {
			out = append(out, c)
		}
	}
	return out
}

// waitGone waits until the processes are dead (zombies count as dead), at
// most 5 s in all.
func waitGone(pids ...int) {
	deadline := time.Now().Add(5 * time.Second)
	for _, p := range pids {
		for p > 0 && Alive(p, "") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// stopPid sends SIGTERM, waits up to timeout, then SIGKILLs.
func (e *Env) stopPid(name string, pid int, timeout time.Duration) {
	if syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	deadline := time.Now().Add(timeout)
	for Alive(pid, "") {
		if time.Now().After(deadline) {
			e.logf("%s: still alive after %s, sending SIGKILL", name, timeout)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			waitGone(pid)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// errPortBusy is the error for a port another process holds.
func errPortBusy(name string, port int, what string) error {
	return fmt.Errorf("%s: port %d%s is already in use by another process (see: ss -ltnp)", name, port, what)
}

// isRoot: processes then run as the postgres user (initdb refuses root).
func isRoot() bool { return os.Geteuid() == 0 }

var (
	pgCredOnce sync.Once
	pgCred     *syscall.Credential
	pgCredErr  error
	pgHome     string // the postgres user's HOME
)

// postgresCredential is the postgres user's uid, gid and groups, to run a
// process as it when we are root; nil when we are not.
func postgresCredential() (*syscall.Credential, error) {
	if !isRoot() {
		return nil, nil
	}
	pgCredOnce.Do(func() {
		u, err := user.Lookup(pgUser)
		if err != nil {
			pgCredErr = fmt.Errorf("no %s user (scripts/install-deps --servers creates it): %w", pgUser, err)
			return
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		c := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		gids, _ := u.GroupIds()
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				c.Groups = append(c.Groups, uint32(n))
			}
		}
		pgCred, pgHome = c, u.HomeDir
	})
	return pgCred, pgCredErr
}

// chownPG gives path to the postgres user when we are root.
func chownPG(path string) error {
	c, err := postgresCredential()
	if err != nil || c == nil {
		return err
	}
	return os.Chown(path, int(c.Uid), int(c.Gid))
}

// asPG prepares cmd to run as the postgres user (when we are root), in /
// (a cwd it cannot enter makes initdb and pg_ctl complain).
func asPG(cmd *exec.Cmd) error {
	c, err := postgresCredential()
	if err != nil {
		return err
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = c
	cmd.Dir = "/"
	if c != nil && cmd.Env == nil {
		// Not root's HOME: a server's libpq (a subscription's connection
		// to its publisher) looks for ~/.postgresql/postgresql.crt when
		// the conninfo asks for TLS, and fails on a directory it cannot
		// enter ("Permission denied"), where a missing file is fine.
		cmd.Env = append(os.Environ(), "HOME="+pgHome)
	}
	return nil
}

// runPG runs a PostgreSQL tool as the postgres user with its output in
// logFile (or discarded), and returns when it exits.
func runPG(logFile string, name string, args ...string) error {
	cmd, closeLog, err := pgCommand(logFile, name, args...)
	if err != nil {
		return err
	}
	defer closeLog()
	return cmd.Run()
}

// pgCommand is a PostgreSQL tool's command as the postgres user, its
// output in logFile (or discarded); closeLog closes that file.
func pgCommand(logFile string, name string, args ...string) (cmd *exec.Cmd, closeLog func(), err error) {
	cmd = exec.Command(name, args...)
	if err := asPG(cmd); err != nil {
		return nil, nil, err
	}
	closeLog = func() {}
	if logFile != "" {
		f, err := os.Create(logFile)
		if err != nil {
			return nil, nil, err
		}
		closeLog = func() { f.Close() }
		cmd.Stdout, cmd.Stderr = f, f
	}
	return cmd, closeLog, nil
}

// startDaemon starts cmd in a session of its own (a Ctrl-C in the calling
// terminal or the end of a test process does not take it down), with its
// output in out (nil: /dev/null), and reaps it in the background when it exits while this
// process still runs (a zombie would keep its pid, and a postmaster pid
// file naming it, alive). Its pid is the daemon's own: no shell between.
func startDaemon(cmd *exec.Cmd, out *os.File) (int, error) {
	return startDaemonWith(cmd, out, cmd.Start)
}

// startDaemonWith is startDaemon with start in place of cmd.Start (a start
// on another host: Placement.Start).
func startDaemonWith(cmd *exec.Cmd, out *os.File, start func() error) (int, error) {
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer devnull.Close()
	cmd.Stdin = devnull
	if out == nil {
		out = devnull
	}
	cmd.Stdout, cmd.Stderr = out, out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
	if err := start(); err != nil {
		return 0, err
	}
	go func() { _ = cmd.Wait() }()
	return cmd.Process.Pid, nil
}

// tailLog is the last lines of a log, indented, for error messages.
func tailLog(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("    (no log at %s)\n", path)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 25 {
		lines = lines[len(lines)-25:]
	}
	return fmt.Sprintf("    --- last lines of %s ---\n    %s\n", path, strings.Join(lines, "\n    "))
}

// withLogs appends the tails of logs to err.
func withLogs(err error, logs ...string) error {
	if err == nil {
		return nil
	}
	var b strings.Builder
	for _, l := range logs {
		b.WriteString(tailLog(l))
	}
	return fmt.Errorf("%w\n%s", err, strings.TrimRight(b.String(), "\n"))
}

var errTimeout = errors.New("timed out")

func itoa(n int) string { return strconv.Itoa(n) }

func killTERM(pid int) error { return syscall.Kill(pid, syscall.SIGTERM) }
