package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/internal/devenv"
)

// Patroni groups: scripts/devenv nodes that are a primary and synchronous
// standbys managed by Patroni, with ZooKeeper (the devenv ensemble) as DCS.
//
// StartPGGroups asks devenv for groups at node numbers
// GroupFirstNode and GroupFirstNode+1 (SHARDVISOR_PG_HA=2
// SHARDVISOR_PG_HA_NODES=5,6): the plain nodes below them stay plain, and
// plain tests keep using nodes 1..GroupFirstNode-1 (the suite asks for up to
// 4: e2e, gc, migrate), which is why the groups do not start at node 4.
const (
	// GroupFirstNode is the scripts/devenv node number of the first group.
	GroupFirstNode = 5
	// MaxGroups is how many groups StartPGGroups can give.
	MaxGroups = 2
	// GroupMembers is the number of members of each group.
	GroupMembers = 2
	// PatroniNamespace is the groups' Patroni namespace in ZooKeeper.
	PatroniNamespace = "/service/"
)

// groupNodes configures devenv's up to create (or keep) the groups.
func groupNodes(c *devenv.Config) {
	c.PGNodes = max(GroupFirstNode+MaxGroups-1, existingPGNodes())
	c.HA = GroupMembers
	c.HANodes = nil
	for g := 0; g < MaxGroups; g++ {
		c.HANodes = append(c.HANodes, GroupFirstNode+g)
	}
}

// isGroupNode reports whether devenv node num (1-based) is a Patroni group.
func isGroupNode(num int) bool {
	_, err := os.Stat(filepath.Join(StateDir(), "pg", "pg"+strconv.Itoa(num), "members"))
	return err == nil
}

// memberPGPort and memberAPIPort follow scripts/devenv: member m (1-based)
// of node num listens on BASE+(num-1)+100*(m-1), its Patroni REST API on
// BASE+1000+(num-1)+100*(m-1).
func memberPGPort(num, m int) int  { return pgPortBase() + num - 1 + 100*(m-1) }
func memberAPIPort(num, m int) int { return pgPortBase() + 1000 + num - 1 + 100*(m-1) }
func memberName(num, m int) string { return fmt.Sprintf("pg%d-m%d", num, m) }

// poolersListening reports whether every member's PgBouncer of group num
// accepts TCP connections.
func poolersListening(num int) bool {
	for m := 1; m <= GroupMembers; m++ {
		if !listening(poolPort(memberPGPort(num, m))) {
			return false
		}
	}
	return true
}

var groupUpFailed error // a failed `up` of the groups is not retried in this process

// ensureGroupsUp makes sure ZooKeeper and the MaxGroups groups are healthy,
// running devenv's up (which creates the groups if needed) if not.
func ensureGroupsUp() error {
	upMu.Lock()
	defer upMu.Unlock()
	if groupUpFailed != nil {
		return groupUpFailed
	}
	healthy := func() bool {
		if !quickHealthy(0) {
			return false
		}
		for g := 0; g < MaxGroups; g++ {
			if s := groupStatus(GroupFirstNode + g); !s.healthy() || !poolersListening(GroupFirstNode+g) {
				return false
			}
		}
		return true
	}
	if healthy() {
		return nil
	}
	unlock, err := lockFile(filepath.Join(StateDir(), "testenv-up.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if healthy() {
		return nil
	}
	if err := devenvDo("up", groupNodes, (*devenv.Env).Up); err != nil {
		groupUpFailed = err
		return err
	}
	return nil
}

// StartPGGroups returns n (1..MaxGroups) Patroni groups of GroupMembers
// members each, starting them if needed (devenv's up with HA, as
// SHARDVISOR_PG_HA does), each with a fresh database for the test, created on
// the group's primary (it replicates to the standbys). The nodes' DSN,
// DSNWithPassword and AdminDSN list every member with
// target_session_attrs=read-write, so they reach the current primary, and
// PoolDSN and PoolDSNWithPassword every member's PgBouncer so; Host, Port
// and PoolPort are the primary's when StartPGGroups returned. It skips the test
// under -short, and with SHARDVISOR_TEST_PG (external servers have no
// groups).
//
// KillPrimary and StartMembers require Exclusive. When the test ends,
// members that are down are started again and the groups are healthy
// before other tests continue.
func StartPGGroups(t testing.TB, n int) *PG {
	t.Helper()
	skipIfShort(t)
	if len(externalPG()) > 0 {
		t.Skip("testenv: Patroni groups come only from scripts/devenv; SHARDVISOR_TEST_PG gives external servers, so this group test is skipped")
	}
	if n < 1 || n > MaxGroups {
		t.Fatalf("testenv: StartPGGroups(t, %d): between 1 and %d groups", n, MaxGroups)
	}
	st := stateFor(t)
	if err := acquireShared(st); err != nil {
		fatalf(t, "lock: %v", err)
	}
	if err := ensureGroupsUp(); err != nil {
		fatalf(t, "starting Patroni groups: %v", err)
	}
	pwFile := filepath.Join(StateDir(), "pg", "password")
	b, err := os.ReadFile(pwFile)
	if err != nil {
		fatalf(t, "reading PostgreSQL password: %v", err)
	}
	pw := strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
	dbName := "t_" + sanitize(t.Name(), 40) + "_" + randomHex(4)
	pg := &PG{}
	for g := 0; g < n; g++ {
		num := GroupFirstNode + g
		node := &PGNode{
			Index:            g,
			Name:             "pg" + strconv.Itoa(num),
			Host:             "127.0.0.1",
			User:             "postgres",
			Password:         pw,
			PasswordFile:     pwFile,
			PGPassFile:       filepath.Join(StateDir(), "pg", "pgpass"),
			Database:         dbName,
			PatroniScope:     "pg" + strconv.Itoa(num),
			PatroniNamespace: PatroniNamespace,
			st:               st,
			managed:          true,
			num:              num,
			group:            true,
		}
		for m := 1; m <= GroupMembers; m++ {
			node.Members = append(node.Members, net.JoinHostPort("127.0.0.1", strconv.Itoa(memberPGPort(num, m))))
			node.APIPorts = append(node.APIPorts, memberAPIPort(num, m))
		}
		s := groupStatus(num)
		node.Port = memberPGPort(num, 1)
		if s.primary > 0 {
			node.Port = memberPGPort(num, s.primary)
		}
		node.PoolPort = poolPort(node.Port)
		node.fillGroupDSNs()
		pg.Nodes = append(pg.Nodes, node)
	}

	// Register the cleanups before failing: the drop runs after the
	// restart (cleanups run in reverse order).
	st.addCleanup(func() { pg.dropDatabases(t) })
	st.addCleanup(func() {
		for _, node := range pg.Nodes {
			if err := node.restoreGroup(); err != nil {
				t.Errorf("testenv: restoring %s: %v", node.Name, err)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, node := range pg.Nodes {
		if err := node.admin(ctx, "CREATE DATABASE "+pgx.Identifier{dbName}.Sanitize()+" STRATEGY = FILE_COPY"); err != nil {
			fatalf(t, "creating database %s on %s: %v", dbName, node.Name, err)
		}
	}
	// A synchronous commit waits for the standby's flush, not its replay;
	// and pgx does not try the next host of a multi-host DSN when one says
	// the database does not exist (SQLSTATE 3D000). So wait until every
	// member has it before the DSNs are handed out.
	for _, node := range pg.Nodes {
		for _, m := range node.Members {
			dsn := "postgres://" + url.UserPassword(node.User, node.Password).String() + "@" + m + "/" +
				url.PathEscape(dbName) + "?" + managedSSL() + "&connect_timeout=2"
			for {
				err := Exec(ctx, dsn, "SELECT 1")
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					fatalf(t, "database %s on %s member %s: %v", dbName, node.Name, m, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	return pg
}

// fillGroupDSNs sets multi-host DSNs over every member that connect to the
// one accepting writes; the pool DSNs over every member's PgBouncer.
func (n *PGNode) fillGroupDSNs() {
	var pools []string
	for m := 1; m <= GroupMembers; m++ {
		pools = append(pools, net.JoinHostPort("127.0.0.1", strconv.Itoa(poolPort(memberPGPort(n.num, m)))))
	}
	mk := func(hosts []string, user *url.Userinfo, db string) string {
		return "postgres://" + user.String() + "@" + strings.Join(hosts, ",") + "/" + url.PathEscape(db) +
			"?" + managedSSL() + "&target_session_attrs=read-write&connect_timeout=2"
	}
	n.DSN = mk(n.Members, url.User(n.User), n.Database)
	n.DSNWithPassword = mk(n.Members, url.UserPassword(n.User, n.Password), n.Database)
	n.AdminDSN = mk(n.Members, url.UserPassword(n.User, n.Password), "postgres")
	n.PoolDSN = mk(pools, url.User(n.User), n.Database)
	n.PoolDSNWithPassword = mk(pools, url.UserPassword(n.User, n.Password), n.Database)
}

// restoreGroup starts the group's members that are down, if any (with
// their PgBouncers), and waits until every member streams from a primary.
func (n *PGNode) restoreGroup() error {
	if groupStatus(n.num).healthy() && poolersListening(n.num) {
		return nil
	}
	return n.devenvDo("pg-start", func(e *devenv.Env) error { return e.PGStart(n.num) })
}

func (n *PGNode) groupControl(t testing.TB) {
	t.Helper()
	if !n.group {
		t.Fatalf("testenv: %s is not a Patroni group (StartPGGroups gives groups)", n.Name)
	}
	if err := n.control(); err != nil {
		t.Fatalf("testenv: %s: %v", n.Name, err)
	}
}

// KillPrimary SIGKILLs the group's current primary host all at once: its
// Patroni, its postmaster and every postgres child (devenv's PGKill),
// and returns the member that died ("pg5-m1"). A standby takes over once
// the dead Patroni's ZooKeeper session expires (the ttl, 10 s). Requires
// Exclusive.
func (n *PGNode) KillPrimary(t testing.TB) string {
	t.Helper()
	n.groupControl(t)
	var k devenv.Killed
	if err := n.devenvDo("pg-kill", func(e *devenv.Env) (err error) { k, err = e.PGKill(n.num); return err }); err != nil {
		t.Fatalf("testenv: killing %s's primary: %v", n.Name, err)
	}
	return k.Member
}

// StartMembers starts every member of the group that is not running (a
// killed old primary rejoins as a standby: crash recovery, pg_rewind) and
// returns when every member streams from the primary. Requires Exclusive.
func (n *PGNode) StartMembers(t testing.TB) {
	t.Helper()
	n.groupControl(t)
	if err := n.devenvDo("pg-start", func(e *devenv.Env) error { return e.PGStart(n.num) }); err != nil {
		t.Fatalf("testenv: starting %s's members: %v", n.Name, err)
	}
	var s groupState
	WaitFor(t, time.Minute, func() bool { s = groupStatus(n.num); return s.healthy() },
		n.Name+": every member streaming from a primary")
}

// Primary returns the group's current primary member ("pg5-m2"), waiting up
// to a minute while there is none (during a failover).
func (n *PGNode) Primary(t testing.TB) string {
	t.Helper()
	var s groupState
	WaitFor(t, time.Minute, func() bool { s = groupStatus(n.num); return s.primary > 0 },
		n.Name+": a primary")
	return memberName(n.num, s.primary)
}

// Streaming returns the members that stream from the current primary
// right now (none while there is no primary).
func (n *PGNode) Streaming(t testing.TB) []string {
	t.Helper()
	var names []string
	for _, m := range groupStatus(n.num).streaming {
		names = append(names, memberName(n.num, m))
	}
	return names
}

// ---------------------------------------------------------------- Patroni REST API

// patroniStatus is what a member's Patroni answers on GET /.
type patroniStatus struct {
	State       string `json:"state"` // "running", "starting", ...
	Role        string `json:"role"`  // "master" (primary) or "replica"
	Timeline    int    `json:"timeline"`
	Replication []struct {
		ApplicationName string `json:"application_name"` // the member name
		State           string `json:"state"`            // "streaming"
		SyncState       string `json:"sync_state"`       // "sync", "async"
	} `json:"replication"`
}

var patroniClient = &http.Client{Timeout: 1500 * time.Millisecond}

// patroniGet returns the HTTP status and body of GET / on a member's REST
// API: 200 on the leader only.
func patroniGet(port int) (int, patroniStatus, error) {
	var st patroniStatus
	resp, err := patroniClient.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/")
	if err != nil {
		return 0, st, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return resp.StatusCode, st, fmt.Errorf("patroni on port %d: %w", port, err)
	}
	return resp.StatusCode, st, nil
}

// groupState is a group's state as its members' REST APIs tell it.
type groupState struct {
	primary   int   // member number of the primary, 0 if none
	streaming []int // members streaming from the primary
	sync      int   // of which synchronous
	err       error
}

// healthy: a primary, every other member streaming from it, one of them
// synchronously.
func (s groupState) healthy() bool {
	return s.err == nil && s.primary > 0 && len(s.streaming) == GroupMembers-1 && (GroupMembers == 1 || s.sync > 0)
}

// groupStatus asks every member of group num at once.
func groupStatus(num int) groupState {
	type answer struct {
		code int
		st   patroniStatus
		err  error
	}
	answers := make([]answer, GroupMembers)
	var wg sync.WaitGroup
	for m := 1; m <= GroupMembers; m++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, st, err := patroniGet(memberAPIPort(num, m))
			answers[m-1] = answer{code, st, err}
		}()
	}
	wg.Wait()
	var s groupState
	for i, a := range answers {
		if a.code == http.StatusOK && a.st.State == "running" {
			if s.primary != 0 {
				s.err = errors.New("two members answer as primary")
				return s
			}
			s.primary = i + 1
		}
	}
	if s.primary == 0 {
		s.err = fmt.Errorf("pg%d: no primary", num)
		return s
	}
	repl := map[string]string{}
	for _, r := range answers[s.primary-1].st.Replication {
		if r.State == "streaming" {
			repl[r.ApplicationName] = r.SyncState
		}
	}
	// A standby is synchronous for failover only once Patroni's sync
	// record in ZooKeeper names it: in synchronous mode Patroni promotes
	// no other member ("not the healthiest node"). PostgreSQL's
	// sync_state turns "sync" a loop earlier than the record, so ask
	// Patroni's /cluster (role sync_standby comes from the record).
	dcsSync := map[string]bool{}
	if names, err := patroniSyncStandbys(memberAPIPort(num, s.primary)); err == nil {
		for _, n := range names {
			dcsSync[n] = true
		}
	}
	for m := 1; m <= GroupMembers; m++ {
		a := answers[m-1]
		if m == s.primary || a.err != nil || a.st.Role != "replica" || a.st.State != "running" {
			continue
		}
		if syncState, ok := repl[memberName(num, m)]; ok {
			s.streaming = append(s.streaming, m)
			if syncState == "sync" && dcsSync[memberName(num, m)] {
				s.sync++
			}
		}
	}
	return s
}

// patroniSyncStandbys returns the members Patroni's GET /cluster lists as
// sync_standby.
func patroniSyncStandbys(port int) ([]string, error) {
	resp, err := patroniClient.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/cluster")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var c struct {
		Members []struct {
			Name string `json:"name"`
			Role string `json:"role"`
		} `json:"members"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return nil, err
	}
	var out []string
	for _, m := range c.Members {
		if m.Role == "sync_standby" {
			out = append(out, m.Name)
		}
	}
	return out, nil
}

// CutZK cuts member m (1-based) of the group off from ZooKeeper: its
// Patroni's connections to the ensemble go through forwarders of its own,
// which devenv's ZKCut stops (established connections cut, new
// ones refused), while its PostgreSQL and REST API still answer. HealZK
// undoes it; a cleanup heals every member the test cut. Requires
// Exclusive.
func (n *PGNode) CutZK(t testing.TB, m int) {
	t.Helper()
	n.groupControl(t)
	heal := func(e *devenv.Env) error { return e.ZKHeal(n.num, m) }
	if err := n.devenvDo("zk-cut", func(e *devenv.Env) error { return e.ZKCut(n.num, m) }); err != nil {
		t.Fatalf("testenv: cutting %s member %d off from ZooKeeper: %v", n.Name, m, err)
	}
	t.Cleanup(func() { _ = n.devenvDo("zk-heal", heal) })
}

// HealZK lets member m reach ZooKeeper again.
func (n *PGNode) HealZK(t testing.TB, m int) {
	t.Helper()
	n.groupControl(t)
	if err := n.devenvDo("zk-heal", func(e *devenv.Env) error { return e.ZKHeal(n.num, m) }); err != nil {
		t.Fatalf("testenv: healing %s member %d: %v", n.Name, m, err)
	}
}

// PrimaryMember returns the number (1-based) of the group's current
// primary, waiting as Primary does.
func (n *PGNode) PrimaryMember(t testing.TB) int {
	t.Helper()
	name := n.Primary(t)
	m, err := strconv.Atoi(name[strings.LastIndex(name, "-m")+2:])
	if err != nil {
		t.Fatalf("testenv: member name %q", name)
	}
	return m
}

// SetPatroniConfig merges patch (JSON) into the group's dynamic
// configuration through a member's REST API (PATCH /config).
func (n *PGNode) SetPatroniConfig(t testing.TB, patch string) {
	t.Helper()
	var last error
	for _, port := range n.APIPorts {
		req, _ := http.NewRequest(http.MethodPatch, "http://127.0.0.1:"+strconv.Itoa(port)+"/config", strings.NewReader(patch))
		resp, err := patroniClient.Do(req)
		if err != nil {
			last = err
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return
		}
		last = fmt.Errorf("PATCH /config on port %d: %s", port, resp.Status)
	}
	t.Fatalf("testenv: %s: %v", n.Name, last)
}
