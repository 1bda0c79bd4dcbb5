package devenv_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// pgbackrest runs pgbackrest on the environment's repository as devenv env
// tells a script to: $SHARDVISOR_PGBACKREST --config=$SHARDVISOR_PGBACKREST_CONFIG.
func pgbackrest(e *devenv.Env, args ...string) (string, error) {
	c := e.PGBackRestCommand()
	cmd := exec.Command(c[0], append(append(c[1:], "--config="+e.BackupConfig()), args...)...)
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// archiver is pg_stat_archiver's archived_count and failed_count on the
// server whose unix socket is in dir, and its archive_mode.
func archiver(t *testing.T, dir string, port int) (archived, failed int64, mode string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", dir, port))
	if err != nil {
		t.Fatalf("%s:%d: %v", dir, port, err)
	}
	defer c.Close(ctx)
	if err := c.QueryRow(ctx, "SELECT archived_count, failed_count, current_setting('archive_mode') FROM pg_stat_archiver").Scan(&archived, &failed, &mode); err != nil {
		t.Fatalf("%s:%d: pg_stat_archiver: %v", dir, port, err)
	}
	return archived, failed, mode
}

// nodeArchives checks node i's WAL archiving: pgbackrest check passes
// (it switches the primary's WAL and waits until the segment is in the
// repository), the primary's archived_count reaches atLeast (the
// archiver counts a segment once archive-push has exited, a moment after
// check sees it), and no server has failed to archive (a group's
// standbys archive nothing until promoted). It returns the primary's
// archived_count.
func nodeArchives(t *testing.T, e *devenv.Env, i int, atLeast int64) int64 {
	t.Helper()
	if out, err := pgbackrest(e, "--stanza="+e.Stanza(i), "check"); err != nil {
		t.Fatalf("pgbackrest check --stanza=%s: %v\n%s", e.Stanza(i), err, out)
	}
	dir, port, name := e.PGDir(i), e.PGPort(i), fmt.Sprintf("pg%d", i)
	if e.IsGroup(i) {
		primary, _, ok, err := e.Primary(i)
		if err != nil || !ok {
			t.Fatalf("pg%d: no primary: %v", i, err)
		}
		n, err := e.Members(i)
		if err != nil {
			t.Fatal(err)
		}
		for m := 1; m <= n; m++ {
			if devenv.MemberName(i, m) == primary {
				dir, port, name = e.MemberDir(i, m), e.MemberPort(i, m), primary
			} else if pidOf(filepath.Join(e.MemberDir(i, m), "data", "postmaster.pid")) != 0 {
				if _, failed, mode := archiver(t, e.MemberDir(i, m), e.MemberPort(i, m)); failed != 0 || mode != "on" {
					t.Errorf("standby %s: failed_count %d, archive_mode %s; want 0, on", devenv.MemberName(i, m), failed, mode)
				}
			}
		}
	}
	var archived, failed int64
	var mode string
	deadline := time.Now().Add(15 * time.Second)
	for archived, failed, mode = archiver(t, dir, port); archived < atLeast && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		archived, failed, mode = archiver(t, dir, port)
	}
	if archived < atLeast || failed != 0 || mode != "on" {
		t.Errorf("%s: archived_count %d, failed_count %d, archive_mode %s; want >= %d, 0, on", name, archived, failed, mode, atLeast)
	}
	return archived
}

// pidOf is the pid in a pid file (0: none, or not running).
func pidOf(file string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	if pid == 0 || !devenv.Alive(pid, "") {
		return 0
	}
	return pid
}

// Every db server archives its WAL into the environment's pgBackRest
// repository, a plain node's and a Patroni group's: pgbackrest check
// passes on each stanza and pg_stat_archiver counts no failure. Servers
// of an older devenv, without archiving (archive_mode takes a restart),
// are restarted by up: the plain node for its out-of-date shardvisor.conf,
// the group's members through Patroni. After a failover the promoted
// member archives with its own archive_command. Long (two group
// restarts, Patroni's ttl): make test-faults runs it; TestUpFaultsDown
// checks a plain node's archiving in make test.
func TestFaultsWALArchiving(t *testing.T) {
	testenv.Faults(t)
	e := throwawayWith(t, devenv.Config{PGNodes: 2, HA: 2, HANodes: []int{2}})
	if err := e.Up(); err != nil {
		t.Fatal(err)
	}
	nodeArchives(t, e, 1, 1)
	nodeArchives(t, e, 2, 1)
	if t.Failed() {
		t.FailNow()
	}

	// An older devenv's servers: pg1's shardvisor.conf without archiving
	// (the running server's is not rewritten), the group's members
	// restarted by Patroni with archive_mode off.
	conf := filepath.Join(e.PGDir(1), "data", "shardvisor.conf")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	old, _, _ := strings.Cut(string(b), "# Continuous archiving")
	if err := os.WriteFile(conf, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	pg1 := pidOf(filepath.Join(e.PGDir(1), "data", "postmaster.pid"))
	for m := 1; m <= 2; m++ {
		yml := filepath.Join(e.MemberDir(2, m), "patroni.yml")
		b, err := os.ReadFile(yml)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(yml, []byte(strings.Replace(string(b), "archive_mode: 'on'", "archive_mode: 'off'", 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pidOf(filepath.Join(e.MemberDir(2, m), "patroni.pid")), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		api := "http://127.0.0.1:" + strconv.Itoa(e.MemberAPIPort(2, m))
		testenv.WaitFor(t, 30*time.Second, func() bool {
			resp, err := http.Get(api + "/patroni")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var st struct {
				Pending bool `json:"pending_restart"`
			}
			return json.NewDecoder(resp.Body).Decode(&st) == nil && st.Pending
		}, devenv.MemberName(2, m)+"'s Patroni marking it pending_restart")
		resp, err := http.Post(api+"/restart", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: POST /restart: %s", devenv.MemberName(2, m), resp.Status)
		}
		if _, _, mode := archiver(t, e.MemberDir(2, m), e.MemberPort(2, m)); mode != "off" {
			t.Fatalf("%s restarted with archive_mode %s, want off", devenv.MemberName(2, m), mode)
		}
	}
	if err := e.Up(); err != nil {
		t.Fatal(err)
	}
	if pid := pidOf(filepath.Join(e.PGDir(1), "data", "postmaster.pid")); pid == pg1 || pid == 0 {
		t.Errorf("pg1 not restarted by up for its out-of-date shardvisor.conf: pid %d, was %d", pid, pg1)
	}
	nodeArchives(t, e, 1, 1)
	nodeArchives(t, e, 2, 1)
	if t.Failed() {
		t.FailNow()
	}

	// A failover: the standby, promoted, archives with its own
	// archive_command (its data directory as pg1-path); pgBackRest finds
	// it the primary among the stanza's servers, the killed one down.
	k, err := e.PGKill(2)
	if err != nil {
		t.Fatal(err)
	}
	var promoted string
	testenv.WaitFor(t, time.Minute, func() bool {
		n, _, ok, _ := e.Primary(2)
		promoted = n
		return ok && n != k.Member
	}, "the other member promoted")
	m := 1
	if promoted == devenv.MemberName(2, 2) {
		m = 2
	}
	// At its promotion it archives the new timeline's history file and
	// the old one's last, partial segment.
	at, _, _ := archiver(t, e.MemberDir(2, m), e.MemberPort(2, m))
	nodeArchives(t, e, 2, at+1)
}
