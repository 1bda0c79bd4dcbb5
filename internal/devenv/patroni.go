package devenv

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-zookeeper/zk"
)

// Patroni groups: node I with N members (pg/pgI/members), scope pgI in
// namespace /service/ of this ensemble, members pgI-m1..pgI-mN, each a
// Patroni (templates/patroni.yml.tmpl) running its PostgreSQL, synchronous
// mode on. Patroni runs as the postgres user.

// memberPatroniPid is member m's Patroni pid if it runs, else 0.
func (e *Env) memberPatroniPid(i, m int) int {
	dir := e.MemberDir(i, m)
	pid := readPid(filepath.Join(dir, "patroni.pid"))
	if pid == 0 || !Alive(pid, patroniBin+" "+filepath.Join(dir, "patroni.yml")) {
		return 0
	}
	return pid
}

// memberPGPid is member m's postmaster pid if it runs, else 0.
func (e *Env) memberPGPid(i, m int) int {
	return postmasterPid(filepath.Join(e.MemberDir(i, m), "data"))
}

// writeMemberConf writes member m's patroni.yml (mode 0600: it holds the
// password); changed is false if it was already so.
func (e *Env) writeMemberConf(i, m int, pw string) (changed bool, err error) {
	dir := e.MemberDir(i, m)
	apiPW := ""
	if e.c.TLS {
		var err error
		if apiPW, err = e.ensureAPIPassword(); err != nil {
			return false, err
		}
	}
	b := e.patroniYML(i, m, pw, apiPW)
	if old, err := os.ReadFile(filepath.Join(dir, "patroni.yml")); err == nil && string(old) == string(b) {
		return false, nil
	}
	tmp := filepath.Join(dir, ".patroni.yml.tmp")
	if err := writePGFile(tmp, b, 0o600); err != nil {
		return false, err
	}
	return true, os.Rename(tmp, filepath.Join(dir, "patroni.yml"))
}

// memberLaunch starts member m's Patroni unless it runs, without waiting.
func (e *Env) memberLaunch(i, m int) (int, error) {
	dir := e.MemberDir(i, m)
	name := fmt.Sprintf("pg%d.m%d", i, m)
	if pid := e.memberPatroniPid(i, m); pid != 0 {
		return pid, nil
	}
	_ = os.Remove(filepath.Join(dir, "patroni.pid"))
	// A postmaster that outlived its Patroni is adopted by the new one.
	if e.memberPGPid(i, m) == 0 {
		if e.portBusy(MemberName(i, m), e.MemberPort(i, m)) {
			return 0, errPortBusy(name, e.MemberPort(i, m), "")
		}
		waitReaped(filepath.Join(dir, "data"))
	}
	if e.portBusy(MemberName(i, m), e.MemberAPIPort(i, m)) {
		return 0, errPortBusy(name, e.MemberAPIPort(i, m), " (Patroni REST API)")
	}
	if err := e.zkLinkStart(i, m); err != nil {
		return 0, err
	}
	log, err := os.OpenFile(filepath.Join(dir, "patroni.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, err
	}
	defer log.Close()
	fmt.Fprintf(log, "=== devenv: starting Patroni %s at %s ===\n", MemberName(i, m), time.Now().Format("2006-01-02 15:04:05"))
	cmd := exec.Command(patroniBin, filepath.Join(dir, "patroni.yml"))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "HOME=" + dir}
	if err := asPG(cmd); err != nil {
		return 0, err
	}
	pid, err := e.startOn(MemberName(i, m), cmd, log)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	if err := writePid(filepath.Join(dir, "patroni.pid"), pid); err != nil {
		return 0, err
	}
	e.logf("%s: Patroni started (pid %d, postgres port %d, REST API %d)", name, pid, e.MemberPort(i, m), e.MemberAPIPort(i, m))
	return pid, nil
}

// groupPrepare creates group i's directories and configs (a new group gets
// pg/pgI/members with the number asked); fresh: no member has data yet
// (then the first member must initialise the group alone).
func (e *Env) groupPrepare(i int, pw string) (fresh bool, err error) {
	d := e.PGDir(i)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return false, err
	}
	_ = os.Chmod(d, 0o755)
	if !fileExists(filepath.Join(d, "members")) {
		if err := os.WriteFile(filepath.Join(d, "members"), []byte(itoa(e.wantedMembers(i))+"\n"), 0o644); err != nil {
			return false, err
		}
	}
	n, _, err := e.recordedMembers(i)
	if err != nil {
		return false, err
	}
	fresh, anyRunning := true, false
	for m := 1; m <= n; m++ {
		dir := e.MemberDir(i, m)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return false, err
		}
		if err := chownPG(dir); err != nil {
			return false, err
		}
		_ = os.Chmod(dir, 0o755)
		if fileExists(filepath.Join(dir, "data", "PG_VERSION")) {
			fresh = false
		}
		if e.c.TLS {
			// Patroni runs with HOME the member's directory, and so
			// does the postmaster it starts.
			if err := e.writeClientHome(dir, MemberName(i, m)); err != nil {
				return false, fmt.Errorf("pg%d.m%d: %w", i, m, err)
			}
		}
		// Before patroni.yml, which names it.
		if err := e.writeRoleChange(e.memberPooler(i, m)); err != nil {
			return false, fmt.Errorf("pg%d.m%d: %w", i, m, err)
		}
		changed, err := e.writeMemberConf(i, m, pw)
		if err != nil {
			return false, err
		}
		if pid := e.memberPatroniPid(i, m); pid != 0 {
			anyRunning = true
			if changed {
				e.logf("pg%d.m%d: patroni.yml changed, reloading Patroni (pid %d)", i, m, pid)
				_ = syscall.Kill(pid, syscall.SIGHUP)
			}
		}
	}
	// A group without data but with state in ZooKeeper (its directory was
	// removed by hand) would wait for a leader that is gone: clear it.
	if fresh && !anyRunning {
		if err := e.zkDeleteAll(PatroniNamespace + "pg" + itoa(i)); err != nil {
			return false, fmt.Errorf("pg%d: cannot clear %spg%d in ZooKeeper: %w", i, PatroniNamespace, i, err)
		}
	}
	if err := e.ensureScope(i); err != nil {
		return false, fmt.Errorf("pg%d: its scope in %s: %w", i, PatroniNamespace, err)
	}
	return fresh, nil
}

// groupLaunchAll starts the members of the groups that are not running. A
// new group's first member starts alone until it holds the initialise key,
// so that it bootstraps and the others clone it.
func (e *Env) groupLaunchAll(pw string, deadline time.Time, groups ...int) error {
	var fresh []int
	waits := map[string]int{}
	for _, i := range groups {
		isFresh, err := e.groupPrepare(i, pw)
		if err != nil {
			return err
		}
		// Every member's PgBouncer, whatever its member's state: it
		// logs into its server only when a client comes.
		for _, p := range e.groupPoolers(i) {
			if err := e.poolLaunch(p, pw); err != nil {
				return err
			}
		}
		if isFresh && e.memberPatroniPid(i, 1) == 0 {
			// The pid as started, not read back by its command line:
			// right after exec the kernel may not have set that up yet
			// (an empty /proc/PID/cmdline), which read as "exited".
			pid, err := e.memberLaunch(i, 1)
			if err != nil {
				return err
			}
			fresh = append(fresh, i)
			waits[PatroniNamespace+"pg"+itoa(i)+"/initialize"] = pid
			continue
		}
		n, _, _ := e.recordedMembers(i)
		for m := 1; m <= n; m++ {
			if _, err := e.memberLaunch(i, m); err != nil {
				return err
			}
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	if err := e.zkWaitCreated(waits, deadline); err != nil {
		var logs []string
		for _, i := range fresh {
			logs = append(logs, filepath.Join(e.MemberDir(i, 1), "patroni.log"))
		}
		return withLogs(fmt.Errorf("a new group's first member did not start initialising it: %w", err), logs...)
	}
	for _, i := range fresh {
		n, _, _ := e.recordedMembers(i)
		for m := 2; m <= n; m++ {
			if _, err := e.memberLaunch(i, m); err != nil {
				return err
			}
		}
	}
	return nil
}

// convergeBody: the dynamic configuration keys shardvisor depends on, set
// on a group bootstrapped before they were in its bootstrap section (read
// only once). PATCH /config on any member merges.
const convergeBody = `{"failsafe_mode": true, "ignore_slots": [{"type": "logical", "plugin": "pgoutput"}], "postgresql": {"parameters": {"checkpoint_timeout": "30s", "wal_keep_size": "128MB", "max_wal_size": "256MB", "min_wal_size": "32MB"}}}`

func (e *Env) groupConverge(i int) {
	n, _, _ := e.recordedMembers(i)
	for m := 1; m <= n; m++ {
		api := e.patroniAPI()
		req, err := api.request(http.MethodPatch, e.addr(MemberName(i, m)), e.MemberAPIPort(i, m), "/config", strings.NewReader(convergeBody))
		if err != nil {
			break
		}
		req.Header.Set("Content-Type", "application/json")
		if resp, err := api.client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode < 300 {
				return
			}
		}
	}
	e.logf("pg%d: could not set failsafe_mode/ignore_slots through Patroni's REST API", i)
}

// groupStop stops the members' PgBouncers, then SIGTERMs the members'
// Patroni (each stops its postgres): the standbys first, the primary once
// their postgres is down. (A sync standby's Patroni waits until the
// primary releases it, up to 2*loop_wait, and stopping the primary first
// would let a standby take over.) Then it makes sure postgres is down too.
func (e *Env) groupStop(i int) {
	n, ok, err := e.recordedMembers(i)
	if err != nil || !ok {
		return
	}
	for _, p := range e.groupPoolers(i) {
		e.poolStop(p)
	}
	leader, _, _, _ := e.Primary(i)
	type stopping struct{ m, pid int }
	var pids []stopping
	for m := 1; m <= n; m++ {
		pid := e.memberPatroniPid(i, m)
		if MemberName(i, m) == leader || pid == 0 {
			continue
		}
		pg := e.memberPGPid(i, m)
		_ = syscall.Kill(pid, syscall.SIGTERM)
		pids = append(pids, stopping{m, pid})
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if (pg != 0 && !Alive(pg, "")) || (pg == 0 && !Alive(pid, "")) {
				break
			}
		}
	}
	for m := 1; m <= n; m++ {
		if MemberName(i, m) != leader {
			continue
		}
		if pid := e.memberPatroniPid(i, m); pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGTERM)
			pids = append(pids, stopping{m, pid})
		}
	}
	for _, s := range pids {
		e.stopPid(fmt.Sprintf("pg%d.m%d (Patroni)", i, s.m), s.pid, 60*time.Second)
		e.logf("pg%d.m%d: Patroni stopped (pid %d)", i, s.m, s.pid)
	}
	for m := 1; m <= n; m++ {
		dir := e.MemberDir(i, m)
		_ = os.Remove(filepath.Join(dir, "patroni.pid"))
		if pid := e.memberPGPid(i, m); pid != 0 {
			e.pgCtlStop(fmt.Sprintf("pg%d.m%d", i, m), filepath.Join(dir, "data"), pid)
			e.logf("pg%d.m%d: postgres stopped (pid %d)", i, m, pid)
		}
		e.zkLinkStop(i, m)
	}
}

// groupSyncPassword sets the password file's password on group i's
// primary (it replicates).
func (e *Env) groupSyncPassword(i int, pw string) error {
	name, _, ok, err := e.Primary(i)
	if err != nil || !ok {
		return fmt.Errorf("pg%d: no primary to set the password on", i)
	}
	m, _ := strconv.Atoi(name[strings.LastIndex(name, "-m")+2:])
	return setPassword(e.MemberDir(i, m), e.MemberPort(i, m), pw)
}

// Killed says what a PGKill killed.
type Killed struct {
	Node          int
	Member        string // the group's primary ("pg4-m1"); "" for a plain node
	Port          int
	PatroniPid    int // 0: none
	PostmasterPid int // 0: none
	Children      int
}

// String is the line scripts/devenv pg-kill printed (scripts parse it).
func (k Killed) String() string {
	if k.Member == "" {
		return fmt.Sprintf("pg%d: killed (postmaster pid %d and %d children)", k.Node, k.PostmasterPid, k.Children)
	}
	dash := func(p int) string {
		if p == 0 {
			return "-"
		}
		return strconv.Itoa(p)
	}
	return fmt.Sprintf("pg%d: killed primary %s (127.0.0.1:%d; Patroni pid %s, postmaster pid %s and %d children)",
		k.Node, k.Member, k.Port, dash(k.PatroniPid), dash(k.PostmasterPid), k.Children)
}

// PGKill SIGKILLs node i's postmaster and all its children at once; for a
// group, its current primary's together with its Patroni and its
// PgBouncer (the host dies). A plain node's PgBouncer lives on, and serves
// again once the node is started. It returns once they are dead.
func (e *Env) PGKill(i int) (Killed, error) {
	unlock, err := e.lock()
	if err != nil {
		return Killed{}, err
	}
	defer unlock()
	if !e.IsGroup(i) {
		pid := e.pgPid(i)
		if pid == 0 {
			return Killed{}, fmt.Errorf("pg%d is not running", i)
		}
		k := Killed{Node: i, Port: e.PGPort(i), PostmasterPid: pid, Children: killPostmasterTree(pid)}
		waitGone(pid)
		return k, nil
	}
	name, port, ok, err := e.Primary(i)
	if err != nil {
		return Killed{}, err
	}
	if !ok {
		// No REST API says primary (a Patroni frozen or cut off): the
		// leader key in ZooKeeper does.
		b, err := e.zkGet(PatroniNamespace + "pg" + itoa(i) + "/leader")
		if err != nil || len(b) == 0 {
			return Killed{}, fmt.Errorf("pg%d: no primary found (REST APIs and ZooKeeper leader key %spg%d/leader)", i, PatroniNamespace, i)
		}
		name = string(b)
	}
	sm := regexp.MustCompile(`^pg` + itoa(i) + `-m([1-9])$`).FindStringSubmatch(name)
	if sm == nil {
		return Killed{}, fmt.Errorf("pg%d: unexpected primary member name '%s'", i, name)
	}
	m, _ := strconv.Atoi(sm[1])
	if !ok {
		port = e.MemberPort(i, m)
	}
	k := Killed{Node: i, Member: name, Port: port, PatroniPid: e.memberPatroniPid(i, m), PostmasterPid: e.memberPGPid(i, m)}
	switch {
	case k.PostmasterPid == 0 && k.PatroniPid == 0:
		return Killed{}, fmt.Errorf("pg%d: primary %s has neither a running Patroni nor a postmaster", i, name)
	case k.PostmasterPid != 0 && k.PatroniPid != 0:
		k.Children = killPostmasterTree(k.PostmasterPid, k.PatroniPid)
	case k.PostmasterPid != 0:
		k.Children = killPostmasterTree(k.PostmasterPid)
	default:
		_ = syscall.Kill(k.PatroniPid, syscall.SIGKILL)
	}
	waitGone(k.PatroniPid, k.PostmasterPid)
	_ = os.Remove(filepath.Join(e.MemberDir(i, m), "patroni.pid"))
	e.poolKill(e.memberPooler(i, m))
	return k, nil
}

// ---------------------------------------------------------------- Patroni's state in ZooKeeper

// zkConnected is a connected client, or an error by the deadline: the
// superuser, by its certificate with TLS, else by the digest password
// (it resets the ACLs a TLS run left: ensureScope).
func (e *Env) zkConnected(timeout time.Duration) (*zk.Conn, error) {
	c, err := e.zkConn()
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(timeout); c.State() != zk.StateHasSession; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.Close()
			return nil, fmt.Errorf("no ZooKeeper session with %s after %s", e.ZKConnect(), timeout)
		}
	}
	if !e.c.TLS {
		pw, err := e.ensureSuper()
		if err == nil {
			err = c.AddAuth("digest", []byte("super:"+pw))
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("ZooKeeper superuser: %w", err)
		}
	}
	return c, nil
}

func (e *Env) zkGet(path string) ([]byte, error) {
	c, err := e.zkConnected(15 * time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	b, _, err := c.Get(path)
	return b, err
}

// zkDeleteAll deletes path and everything under it, if it exists.
func (e *Env) zkDeleteAll(path string) error {
	c, err := e.zkConnected(15 * time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	var del func(p string) error
	del = func(p string) error {
		kids, _, err := c.Children(p)
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, k := range kids {
			if err := del(p + "/" + k); err != nil {
				return err
			}
		}
		if err := c.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		return nil
	}
	return del(path)
}

// zkWaitCreated waits until every path exists; it fails when the process
// expected to create one (its pid) is gone.
func (e *Env) zkWaitCreated(waits map[string]int, deadline time.Time) error {
	c, err := e.zkConnected(time.Until(deadline))
	if err != nil {
		return err
	}
	defer c.Close()
	for len(waits) > 0 {
		for p, pid := range waits {
			ok, _, err := c.Exists(p)
			if err != nil {
				return err
			}
			if ok {
				delete(waits, p)
			} else if !Alive(pid, "") {
				return fmt.Errorf("process %d exited before creating %s", pid, p)
			}
		}
		if len(waits) > 0 && time.Now().After(deadline) {
			var ps []string
			for p := range waits {
				ps = append(ps, p)
			}
			return fmt.Errorf("timed out waiting for %s", strings.Join(ps, " "))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// groupRestartUnarchived restarts, through their Patroni, the running
// members of group i whose PostgreSQL does not archive (started by an
// older devenv: archive_mode takes a restart, which Patroni does not make
// on a reload of patroni.yml; it marks the member pending_restart). The
// standbys go first, the primary last: Patroni restarts it in place,
// keeping the leader key, so no failover. It waits until each member's
// Patroni says a restart is pending (it has read the new patroni.yml,
// which up's SIGHUP asked for), then until the group is healthy again.
func (e *Env) groupRestartUnarchived(i int, deadline time.Time) error {
	n, _, err := e.recordedMembers(i)
	if err != nil {
		return err
	}
	leader, _, _, _ := e.Primary(i)
	var order []int
	for m := 1; m <= n; m++ {
		if MemberName(i, m) != leader {
			order = append(order, m)
		}
	}
	for m := 1; m <= n; m++ {
		if MemberName(i, m) == leader {
			order = append(order, m)
		}
	}
	restarted := false
	for _, m := range order {
		name := fmt.Sprintf("pg%d.m%d", i, m)
		if e.memberPatroniPid(i, m) == 0 || e.memberPGPid(i, m) == 0 {
			continue
		}
		mode, err := queryLocal(e.MemberDir(i, m), e.MemberPort(i, m), "SHOW archive_mode")
		if err != nil || mode != "off" {
			continue
		}
		api := apiEndpoint{e.addr(MemberName(i, m)), e.MemberAPIPort(i, m), e.patroniAPI()}
		for {
			if pending, _ := api.get("/patroni").body["pending_restart"].(bool); pending {
				break
			}
			if time.Now().After(deadline) {
				return withLogs(fmt.Errorf("%s: runs without WAL archiving, and its Patroni has not marked it pending_restart after reading patroni.yml again", name),
					filepath.Join(e.MemberDir(i, m), "patroni.log"))
			}
			time.Sleep(100 * time.Millisecond)
		}
		e.logf("%s: runs without WAL archiving (started by an older devenv); restarting its postgres through Patroni", name)
		req, err := api.c.request(http.MethodPost, api.addr, api.port, "/restart", strings.NewReader(`{"restart_pending": true}`))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		client := *api.c.client
		client.Timeout = max(time.Until(deadline), 5*time.Second) // the reply comes once it has restarted
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("%s: POST /restart: %w", name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return withLogs(fmt.Errorf("%s: POST /restart: %s %s", name, resp.Status, strings.TrimSpace(string(b))),
				filepath.Join(e.MemberDir(i, m), "patroni.log"), filepath.Join(e.MemberDir(i, m), "postgres.log"))
		}
		restarted = true
	}
	if !restarted {
		return nil
	}
	return e.groupWait(i, deadline)
}
