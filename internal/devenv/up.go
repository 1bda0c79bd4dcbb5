package devenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Up starts everything that is not running and waits until it is healthy
// (idempotent): the ensemble, NodeCount nodes (new ones plain or groups as
// configured), then the groups once the ensemble serves.
func (e *Env) Up() error {
	unlock, err := e.lock()
	if err != nil {
		return err
	}
	defer unlock()
	var nodes, groups []int
	for i := 1; i <= e.NodeCount(); i++ {
		if err := e.checkKind(i); err != nil {
			return err
		}
		n, err := e.Members(i)
		if err != nil {
			return err
		}
		if n == 1 {
			nodes = append(nodes, i)
		} else {
			groups = append(groups, i)
		}
	}
	if err := ensureInstalled(len(groups) > 0); err != nil {
		return err
	}
	pw, pwChanged, err := e.ensurePassword()
	if err != nil {
		return err
	}
	// Before the parallel launches, which would each create it.
	if _, err := e.ensureSuper(); err != nil {
		return err
	}
	if e.c.TLS {
		// The CA too: the PostgreSQL servers' certificates are of it.
		if err := e.ensureTLS(); err != nil {
			return err
		}
	}
	// Before the servers start: their archive_command names it.
	if err := e.ensureBackup(); err != nil {
		return fmt.Errorf("pgBackRest's directory %s: %w", e.BackupDir(), err)
	}
	e.switchMode(nodes, groups)
	deadline := time.Now().Add(e.c.Timeout)
	// Each node's stanza once the node is healthy, beside the rest of up,
	// unless the repository has it for the node's database already.
	var stanzas sync.WaitGroup
	stanzaErrs := make([]error, e.NodeCount()+1)
	defer stanzas.Wait()
	stanzaCreate := func(i int) {
		if e.stanzaCurrent(i) {
			return
		}
		stanzas.Add(1)
		go func() { defer stanzas.Done(); stanzaErrs[i] = e.stanzaCreate(i) }()
	}
	// Every server at once: a node's initdb runs while the JVMs start.
	err = parallel(ZKServers, func(k int) error { return e.zkLaunch(k + 1) })
	// Each plain node's PgBouncer with it: it logs into its server only
	// when a client comes.
	err = errors.Join(err, parallel(len(nodes), func(k int) error {
		if err := e.pgLaunch(nodes[k]); err != nil {
			return err
		}
		return e.poolLaunch(e.nodePooler(nodes[k]), pw)
	}))
	if err != nil {
		return err
	}
	// Patroni gives up when ZooKeeper does not answer within 15 s: start
	// the groups once the ensemble serves.
	if err := e.waitHealthy(deadline, true, nodes...); err != nil {
		return fmt.Errorf("up failed (state dir %s): %w", e.c.Dir, err)
	}
	// Servers started by an older devenv keep their zoo.cfg until they
	// restart: restart them one at a time (the others keep a quorum), so
	// that a changed setting reaches an existing ensemble too.
	for i := 1; i <= ZKServers; i++ {
		if !e.zkConfigStale(i) {
			continue
		}
		e.logf("zk%d: zoo.cfg is out of date; restarting it with the current one", i)
		e.zkStop(i)
		if err := e.zkLaunch(i); err != nil {
			return err
		}
		if err := e.waitHealthy(deadline, true); err != nil {
			return fmt.Errorf("up failed: zk%d did not serve again after its restart (state dir %s): %w", i, e.c.Dir, err)
		}
	}
	for _, i := range nodes {
		if err := e.pgAfterStart(i); err != nil {
			return fmt.Errorf("pg%d: %w", i, err)
		}
		stanzaCreate(i)
	}
	if len(groups) > 0 {
		if err := e.groupLaunchAll(pw, deadline, groups...); err != nil {
			return err
		}
		for _, i := range groups {
			if err := e.groupWait(i, deadline); err != nil {
				return fmt.Errorf("up failed: group pg%d is not healthy (state dir %s): %w", i, e.c.Dir, err)
			}
			e.groupConverge(i)
			if err := e.groupStreamUser(i); err != nil {
				return fmt.Errorf("pg%d: %w", i, err)
			}
			if err := e.groupRestartUnarchived(i, deadline); err != nil {
				return fmt.Errorf("up failed: group pg%d (state dir %s): %w", i, e.c.Dir, err)
			}
			stanzaCreate(i)
		}
	}
	if pwChanged {
		for _, i := range nodes {
			if err := setPassword(e.PGDir(i), e.PGPort(i), pw); err != nil {
				return fmt.Errorf("pg%d: setting the new password: %w", i, err)
			}
		}
		for _, i := range groups {
			if err := e.groupSyncPassword(i, pw); err != nil {
				return err
			}
		}
	}
	var poolers []pooler
	for _, i := range nodes {
		poolers = append(poolers, e.nodePooler(i))
	}
	for _, i := range groups {
		poolers = append(poolers, e.groupPoolers(i)...)
	}
	if err := e.waitPoolers(deadline, poolers...); err != nil {
		return fmt.Errorf("up failed (state dir %s): %w", e.c.Dir, err)
	}
	stanzas.Wait()
	if err := errors.Join(stanzaErrs...); err != nil {
		return fmt.Errorf("up failed: WAL archiving into %s: %w", e.BackupConfig(), err)
	}
	return nil
}

// parallel runs f(0..n-1) at once and joins their errors.
func parallel(n int, f func(k int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[k] = f(k) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitHealthy waits until the ensemble (if zk) serves with exactly one
// leader and the plain nodes accept connections; on timeout it names the
// failures with their logs' tails.
func (e *Env) waitHealthy(deadline time.Time, zk bool, nodes ...int) error {
	since := time.Now()
	pw := e.Password()
	for {
		type bad struct{ name, why, log string }
		var bads []bad
		dead := false
		if zk {
			leaders, ok := 0, true
			for i := 1; i <= ZKServers; i++ {
				if e.zkPid(i) == 0 {
					bads, ok, dead = append(bads, bad{fmt.Sprintf("zk%d", i), "process not running", e.zkLog(i)}), false, true
					continue
				}
				switch mode := e.ZKMode(i); mode {
				case "leader":
					leaders++
				case "follower":
				default:
					bads, ok = append(bads, bad{fmt.Sprintf("zk%d", i), mode, e.zkLog(i)}), false
				}
			}
			if ok && leaders != 1 {
				bads = append(bads, bad{"zk", fmt.Sprintf("%d leaders", leaders), ""})
			}
		}
		for _, i := range nodes {
			if e.pgPid(i) == 0 {
				bads, dead = append(bads, bad{fmt.Sprintf("pg%d", i), "process not running", e.pgLog(i)}), true
			} else if !pgReady(e.addr("pg"+itoa(i)), e.PGPort(i), pw, e.c.TLS) {
				bads = append(bads, bad{fmt.Sprintf("pg%d", i), "not accepting connections", e.pgLog(i)})
			}
		}
		if len(bads) == 0 {
			return nil
		}
		// A server whose process is gone 10 s after the start will not
		// come back by waiting longer: fail early.
		if time.Now().After(deadline) || (dead && time.Since(since) >= 10*time.Second) {
			var b strings.Builder
			fmt.Fprintf(&b, "servers not healthy after %ds:", int(time.Since(since).Seconds()))
			for _, x := range bads {
				fmt.Fprintf(&b, "\n  %s: %s", x.name, x.why)
				if x.log != "" {
					b.WriteString("\n" + strings.TrimRight(tailLog(x.log), "\n"))
				}
				if strings.HasPrefix(x.name, "zk") && x.name != "zk" {
					b.WriteString("\n" + strings.TrimRight(tailLog(filepath.Join(filepath.Dir(x.log), "zookeeper.out")), "\n"))
				}
			}
			return errors.New(b.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Down stops everything devenv started (by pid files): the groups first,
// while ZooKeeper still serves their Patroni, then the ensemble and the
// plain nodes, each with its PgBouncer.
func (e *Env) Down() error {
	if _, err := os.Stat(e.c.Dir); err != nil {
		e.logf("nothing to stop (%s does not exist)", e.c.Dir)
		return nil
	}
	unlock, err := e.lock()
	if err != nil {
		return err
	}
	defer unlock()
	var groups, nodes []int
	entries, _ := os.ReadDir(filepath.Join(e.c.Dir, "pg"))
	for _, d := range entries {
		i, ok := nodeNumber(d.Name())
		switch {
		case !ok:
		case e.IsGroup(i):
			groups = append(groups, i)
		case fileExists(e.pgData(i)):
			nodes = append(nodes, i)
		}
	}
	_ = parallel(len(groups), func(k int) error { e.groupStop(groups[k]); return nil })
	zkPids := make([]int, ZKServers+1)
	for i := 1; i <= ZKServers; i++ {
		if zkPids[i] = e.zkPid(i); zkPids[i] != 0 {
			_ = killTERM(zkPids[i])
		}
	}
	_ = parallel(len(nodes), func(k int) error { e.pgStop(nodes[k]); return nil })
	for i := 1; i <= ZKServers; i++ {
		if zkPids[i] != 0 {
			e.stopPid(fmt.Sprintf("zk%d", i), zkPids[i], 10*time.Second)
			_ = os.Remove(filepath.Join(e.ZKDir(i), "zk.pid"))
			e.logf("zk%d: stopped (pid %d)", i, zkPids[i])
		}
	}
	return nil
}

// PGStart starts node i: a plain node, returning once it accepts
// connections, through its PgBouncer too; every member of a group that is
// not running (one killed rejoins as a standby), returning once all
// stream from a primary and take logins through their poolers. The wait
// does not hold the environment.
func (e *Env) PGStart(i int) error {
	if err := e.checkKind(i); err != nil {
		return err
	}
	n, err := e.Members(i)
	if err != nil {
		return err
	}
	if err := ensureInstalled(n > 1); err != nil {
		return err
	}
	unlock, err := e.lock()
	if err != nil {
		return err
	}
	pw, _, err := e.ensurePassword()
	if err == nil {
		err = e.ensureBackup()
	}
	deadline := time.Now().Add(e.c.Timeout)
	if err == nil && n == 1 {
		if err = e.pgLaunch(i); err == nil {
			err = e.poolLaunch(e.nodePooler(i), pw)
		}
	} else if err == nil {
		err = e.groupLaunchAll(pw, deadline, i)
	}
	unlock()
	if err != nil {
		return err
	}
	if n == 1 {
		if err := e.waitHealthy(deadline, false, i); err != nil {
			return fmt.Errorf("pg%d did not become ready: %w", i, err)
		}
	} else if err := e.groupWait(i, deadline); err != nil {
		return fmt.Errorf("pg%d: not every member streams from a primary after %s: %w", i, e.c.Timeout, err)
	}
	// A node new to the repository (up makes the stanzas of the others).
	if !e.stanzaExists(i) {
		if err := e.stanzaCreate(i); err != nil {
			return err
		}
	}
	if n == 1 {
		return e.waitPoolers(deadline, e.nodePooler(i))
	}
	return e.waitPoolers(deadline, e.groupPoolers(i)...)
}

// PGStop stops node i (every member of a group), and its PgBouncer (the
// members').
func (e *Env) PGStop(i int) error {
	return e.locked(func() error {
		if e.IsGroup(i) {
			e.groupStop(i)
		} else {
			e.pgStop(i)
		}
		return nil
	})
}
