package devenv

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// What devenv prints: the status table, the export lines and the logs.
// Scripts and tests parse the first two: their format does not change.

// Status writes one line per server (per member for a group) and reports
// whether everything is up and every group has a leader.
func (e *Env) Status(w io.Writer) (healthy bool) {
	healthy = true
	row := func(name string, port int, pid, state string) {
		fmt.Fprintf(w, "%-11s %-6d %-8s %s\n", name, port, pid, state)
	}
	fmt.Fprintf(w, "%-11s %-6s %-8s %s\n", "SERVER", "PORT", "PID", "STATE")
	leaders := 0
	for i := 1; i <= ZKServers; i++ {
		pid, mode := "-", "stopped"
		if p := e.zkPid(i); p != 0 {
			pid, mode = strconv.Itoa(p), e.ZKMode(i)
		}
		switch mode {
		case "leader":
			leaders++
		case "follower":
		default:
			healthy = false
		}
		row(fmt.Sprintf("zk%d", i), e.ZKPort(i), pid, mode)
	}
	if healthy && leaders != 1 {
		fmt.Fprintf(w, "zk: %d leaders (want exactly 1)\n", leaders)
		healthy = false
	}
	pw := e.Password()
	// A pooler's row follows its server's (or its group's): pgI.pool,
	// pgI.mM.pool; accepting when a login through it works.
	poolRow := func(p pooler, absent bool) {
		pid, state := 0, "absent"
		if !absent {
			pid, state = e.poolState(p, pw)
		}
		if state != "accepting" {
			healthy = false
		}
		pids := "-"
		if pid != 0 {
			pids = strconv.Itoa(pid)
		}
		row(p.label+".pool", p.port, pids, state)
	}
	for i := 1; i <= e.NodeCount(); i++ {
		if e.IsGroup(i) {
			healthy = e.groupStatus(w, i) && healthy
			for _, p := range e.groupPoolers(i) {
				poolRow(p, false)
			}
			continue
		}
		pid, state := "-", "stopped"
		switch p := e.pgPid(i); {
		case !fileExists(filepath.Join(e.pgData(i), "PG_VERSION")):
			state = "absent"
		case p == 0:
		case !pgReady(e.addr("pg"+itoa(i)), e.PGPort(i), pw, e.c.TLS):
			pid, state = strconv.Itoa(p), "not-accepting"
		case e.pgStaleBinary(i):
			pid, state = strconv.Itoa(p), "accepting, binary upgraded on disk: restart with up"
		default:
			pid, state = strconv.Itoa(p), "accepting"
		}
		if state != "accepting" {
			healthy = false
		}
		row(fmt.Sprintf("pg%d", i), e.PGPort(i), pid, state)
		poolRow(e.nodePooler(i), state == "absent")
	}
	return healthy
}

// Summary is what up prints after the status table.
func (e *Env) Summary(w io.Writer) {
	if e.c.TLS {
		fmt.Fprintf(w, "ZooKeeper: %s  (TLS only; certificates in %s: eval \"$(scripts/devenv env)\" for the admin's)\n", e.ZKConnect(), e.TLSDir())
	} else {
		fmt.Fprintf(w, "ZooKeeper: %s  (plain)\n", e.ZKConnect())
	}
	if e.c.TLS {
		fmt.Fprintf(w, "Postgres:  postgres://postgres@%s/postgres?%s  (TLS only; password in %s)\n", e.hostPort("pg1", e.PGPort(1)), e.PGSSLParams(), e.PasswordFile())
	} else {
		fmt.Fprintf(w, "Postgres:  postgres://postgres@%s/postgres  (password in %s)\n", e.hostPort("pg1", e.PGPort(1)), e.PasswordFile())
	}
	fmt.Fprintf(w, "PgBouncer: each db server's port + %d, transaction mode, any role by its own password (SHARDVISOR_PGn_POOL_DSN)\n", PoolPortOffset)
}

// NodeDSN is node i's connection string with the password (with TLS it
// verifies the server against the environment's CA): a group's
// lists every member with target_session_attrs=read-write, so it reaches
// the current primary.
func (e *Env) NodeDSN(i int) string {
	pw := e.Password()
	if !e.IsGroup(i) {
		return fmt.Sprintf("postgres://postgres:%s@%s/postgres?%s", pw, e.hostPort("pg"+itoa(i), e.PGPort(i)), e.PGSSLParams())
	}
	return fmt.Sprintf("postgres://postgres:%s@%s/postgres?%s&target_session_attrs=read-write&connect_timeout=2", pw, e.memberHosts(i), e.PGSSLParams())
}

// NodePoolDSN is NodeDSN through node i's PgBouncer (a group's lists
// every member's pooler): the pooler runs in transaction mode, so a
// client must not keep session state across transactions nor use named
// prepared statements (pgx: default_query_exec_mode=cache_describe, exec
// or simple_protocol; psycopg 3: prepare_threshold=None).
func (e *Env) NodePoolDSN(i int) string {
	pw := e.Password()
	if !e.IsGroup(i) {
		return fmt.Sprintf("postgres://postgres:%s@%s/postgres?%s", pw, e.hostPort("pg"+itoa(i), e.PoolPort(i)), e.PGSSLParams())
	}
	return fmt.Sprintf("postgres://postgres:%s@%s/postgres?%s&target_session_attrs=read-write&connect_timeout=2", pw, e.memberPoolHosts(i), e.PGSSLParams())
}

// MemberPoolDSN is the DSN of member m's PgBouncer in group i alone,
// whatever the member's role, with the password.
func (e *Env) MemberPoolDSN(i, m int) string {
	p := e.memberPooler(i, m)
	return fmt.Sprintf("postgres://postgres:%s@%s/postgres?%s", e.Password(), e.hostPort(p.server, p.port), e.PGSSLParams())
}

func (e *Env) memberHosts(i int) string {
	n, _, _ := e.recordedMembers(i)
	hosts := make([]string, n)
	for m := 1; m <= n; m++ {
		hosts[m-1] = e.hostPort(MemberName(i, m), e.MemberPort(i, m))
	}
	return strings.Join(hosts, ",")
}

// memberPoolHosts are group i's members' poolers, host:port each.
func (e *Env) memberPoolHosts(i int) string {
	var hosts []string
	for _, p := range e.groupPoolers(i) {
		hosts = append(hosts, e.hostPort(p.server, p.port))
	}
	return strings.Join(hosts, ",")
}

// Exports writes the `export` lines with the connect strings (`eval
// "$(scripts/devenv env)"`).
func (e *Env) Exports(w io.Writer) {
	fmt.Fprintf(w, "export SHARDVISOR_ZK='%s'\n", e.ZKConnect())
	if e.c.TLS {
		f := e.TLSFiles("admin")
		fmt.Fprintf(w, "export SHARDVISOR_ZK_TLS_CA='%s'\nexport SHARDVISOR_ZK_TLS_CERT='%s'\nexport SHARDVISOR_ZK_TLS_KEY='%s'\n", f.CA, f.Cert, f.Key)
	}
	fmt.Fprintf(w, "export SHARDVISOR_PG_PASSWORD_FILE='%s'\n", e.PasswordFile())
	fmt.Fprintf(w, "export PGPASSFILE='%s'\n", e.PGPassFile())
	var dsns, pools []string
	for i := 1; i <= e.NodeCount(); i++ {
		dsn, pool := e.NodeDSN(i), e.NodePoolDSN(i)
		fmt.Fprintf(w, "export SHARDVISOR_PG%d_DSN='%s'\n", i, dsn)
		fmt.Fprintf(w, "export SHARDVISOR_PG%d_POOL_DSN='%s'\n", i, pool)
		if e.IsGroup(i) {
			fmt.Fprintf(w, "export SHARDVISOR_PG%d_PATRONI_SCOPE='pg%d'\n", i, i)
			fmt.Fprintf(w, "export SHARDVISOR_PG%d_PATRONI_NAMESPACE='%s'\n", i, PatroniNamespace)
			fmt.Fprintf(w, "export SHARDVISOR_PG%d_MEMBERS='%s'\n", i, e.memberHosts(i))
		}
		dsns, pools = append(dsns, dsn), append(pools, pool)
	}
	fmt.Fprintf(w, "export SHARDVISOR_PG_DSNS='%s'\n", strings.Join(dsns, ","))
	fmt.Fprintf(w, "export SHARDVISOR_PG_POOL_DSNS='%s'\n", strings.Join(pools, ","))
	// pgBackRest on the environment's repository: the command to run
	// (pgbackrest as the postgres user) and its configuration, with a
	// stanza per node, pgI.
	fmt.Fprintf(w, "export SHARDVISOR_PGBACKREST_CONFIG='%s'\n", e.BackupConfig())
	fmt.Fprintf(w, "export SHARDVISOR_PGBACKREST='%s'\n", strings.Join(e.PGBackRestCommand(), " "))
}

var memberNameRE = regexp.MustCompile(`^pg([1-9][0-9]*)[.-]m([1-9])$`)

// Logs lists the log files (name ""), or writes the tail of one: zk1, pg2,
// pg4.m1 (a member's Patroni and PostgreSQL logs), pg4 (all members'),
// pg2.pool and pg4.m1.pool (a PgBouncer's).
func (e *Env) Logs(w io.Writer, name string) error {
	if name == "" {
		for i := 1; i <= ZKServers; i++ {
			fmt.Fprintf(w, "zk%d  %s\n", i, e.zkLog(i))
		}
		for i := 1; i <= e.NodeCount(); i++ {
			if !e.IsGroup(i) {
				fmt.Fprintf(w, "pg%d  %s\n", i, e.pgLog(i))
				fmt.Fprintf(w, "pg%d.pool  %s\n", i, e.nodePooler(i).logFile())
				continue
			}
			n, _, _ := e.recordedMembers(i)
			for m := 1; m <= n; m++ {
				d := e.MemberDir(i, m)
				fmt.Fprintf(w, "pg%d.m%d  %s %s\n", i, m, filepath.Join(d, "patroni.log"), filepath.Join(d, "postgres.log"))
			}
			for _, p := range e.groupPoolers(i) {
				fmt.Fprintf(w, "%s.pool  %s\n", p.label, p.logFile())
			}
		}
		return nil
	}
	if base, ok := strings.CutSuffix(name, ".pool"); ok {
		if sm := memberNameRE.FindStringSubmatch(base); sm != nil {
			i, _ := strconv.Atoi(sm[1])
			m, _ := strconv.Atoi(sm[2])
			if n, _, _ := e.recordedMembers(i); !e.IsGroup(i) || m > n {
				return fmt.Errorf("pg%d has no member %d", i, m)
			}
			return tailTo(w, e.memberPooler(i, m).logFile(), 50)
		}
		if i, ok := nodeNumber(base); ok && i > 0 && !e.IsGroup(i) {
			return tailTo(w, e.nodePooler(i).logFile(), 50)
		}
	}
	if sm := memberNameRE.FindStringSubmatch(name); sm != nil {
		i, _ := strconv.Atoi(sm[1])
		m, _ := strconv.Atoi(sm[2])
		if !e.IsGroup(i) {
			return fmt.Errorf("pg%d is not a Patroni group", i)
		}
		if n, _, _ := e.recordedMembers(i); m > n {
			return fmt.Errorf("pg%d has no member %d", i, m)
		}
		e.memberLogs(w, i, m, 50)
		return nil
	}
	if s, ok := strings.CutPrefix(name, "zk"); ok {
		if i, err := strconv.Atoi(s); err == nil && i >= 1 && i <= ZKServers {
			return tailTo(w, e.zkLog(i), 50)
		}
	}
	if i, ok := nodeNumber(name); ok && i > 0 {
		if !e.IsGroup(i) {
			return tailTo(w, e.pgLog(i), 50)
		}
		n, _, _ := e.recordedMembers(i)
		for m := 1; m <= n; m++ {
			e.memberLogs(w, i, m, 25)
		}
		return nil
	}
	return fmt.Errorf("unknown server '%s' (zk1..zk%d, pg1.., pg4.m1 for a group member, pg1.pool and pg4.m1.pool for a PgBouncer)", name, ZKServers)
}

func (e *Env) memberLogs(w io.Writer, i, m, lines int) {
	for _, f := range []string{"patroni.log", "postgres.log"} {
		p := filepath.Join(e.MemberDir(i, m), f)
		fmt.Fprintf(w, "==> %s <==\n", p)
		if tailTo(w, p, lines) != nil {
			fmt.Fprintln(w, "(none yet)")
		}
	}
}

// tailTo writes the last n lines of a file.
func tailTo(w io.Writer, path string, n int) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	lines := strings.SplitAfter(string(b), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	_, err = io.WriteString(w, strings.Join(lines, ""))
	return err
}

// GroupStatus writes group i's status lines (as in Status) and reports
// whether it is healthy.
func (e *Env) GroupStatus(w io.Writer, i int) bool { return e.groupStatus(w, i) }

// AnythingRunning reports whether any server of the environment runs.
func (e *Env) AnythingRunning() bool {
	for i := 1; i <= ZKServers; i++ {
		if e.zkPid(i) != 0 {
			return true
		}
	}
	for i := 1; i <= max(e.NodeCount(), e.existingNodes()); i++ {
		if e.pgPid(i) != 0 || e.PoolPid(i) != 0 {
			return true
		}
		n, _, _ := e.recordedMembers(i)
		for m := 1; e.IsGroup(i) && m <= n; m++ {
			if e.memberPatroniPid(i, m) != 0 || e.memberPGPid(i, m) != 0 || e.MemberPoolPid(i, m) != 0 {
				return true
			}
		}
	}
	return false
}
