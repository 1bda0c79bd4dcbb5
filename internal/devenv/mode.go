package devenv

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/go-zookeeper/zk"
)

// The environment runs in one of two modes, TLS (Config.TLS: tls.go) or
// plain. Up makes the mode asked the one that runs: servers of the other
// mode are stopped first, all at once (a TLS quorum and a plain one do not
// talk, so a rolling restart would never have a quorum), and the groups'
// ACLs are made those of the mode. The other commands act on whatever
// runs (RunningTLS). ensureScope (tls.go) gives the groups' records the
// mode's ACLs.

// zkCfgTLS reports whether server i's zoo.cfg takes clients over TLS. The
// file is rewritten at each start, so for a running server it is the one
// it runs with.
func (e *Env) zkCfgTLS(i int) (tls, ok bool) {
	b, err := os.ReadFile(filepath.Join(e.ZKDir(i), "zoo.cfg"))
	if err != nil {
		return false, false
	}
	return strings.Contains(string(b), "\nsecureClientPort="), true
}

// RunningTLS reports the mode of the ensemble that runs: whether its
// servers take clients over TLS; ok is false when no server runs.
func (e *Env) RunningTLS() (tls, ok bool) {
	for i := 1; i <= ZKServers; i++ {
		if e.zkPid(i) == 0 {
			continue
		}
		if t, ok := e.zkCfgTLS(i); ok {
			return t, true
		}
	}
	return false, false
}

// memberTLS reports whether member m of group i runs its Patroni with TLS
// (its patroni.yml, which up rewrites before it SIGHUPs a running one: so
// read it before).
func (e *Env) memberTLS(i, m int) bool {
	b, err := os.ReadFile(filepath.Join(e.MemberDir(i, m), "patroni.yml"))
	return err == nil && strings.Contains(string(b), "\n  use_ssl: true\n")
}

// switchMode stops what runs in the other mode than the one asked: the
// plain nodes (their hba_file is read at start only), the groups' Patroni
// (a SIGHUP does not move Patroni's ZooKeeper client to or from TLS),
// while the ensemble still serves them, then every ZooKeeper server. Up
// starts them again in the mode asked. It runs under the lock.
func (e *Env) switchMode(nodes, groups []int) {
	other := &Env{c: e.c}
	other.c.TLS = !e.c.TLS
	mode := map[bool]string{true: "TLS", false: "plain"}
	_ = parallel(len(nodes), func(k int) error {
		if i := nodes[k]; e.pgPid(i) != 0 && e.pgConfTLS(i) != e.c.TLS {
			e.logf("pg%d: runs %s; restarting it %s", i, mode[!e.c.TLS], mode[e.c.TLS])
			e.pgStop(i)
		}
		return nil
	})
	for _, i := range groups {
		n, _, _ := e.recordedMembers(i)
		for m := 1; m <= n; m++ {
			if e.memberPatroniPid(i, m) != 0 && e.memberTLS(i, m) != e.c.TLS {
				e.logf("pg%d: runs %s; restarting it %s", i, mode[!e.c.TLS], mode[e.c.TLS])
				other.groupStop(i)
				break
			}
		}
	}
	if t, ok := e.RunningTLS(); ok && t != e.c.TLS {
		e.logf("zk: the ensemble runs %s; restarting it %s", mode[t], mode[e.c.TLS])
		_ = parallel(ZKServers, func(k int) error { e.zkStop(k + 1); return nil })
	}
}

// setACL sets acl on root (and, with deep, on everything under it) where
// the ACL differs, breadth first; a node gone meanwhile is skipped.
func setACL(c *zk.Conn, root string, acl []zk.ACL, deep bool) error {
	for queue := []string{root}; len(queue) > 0; queue = queue[1:] {
		p := queue[0]
		got, _, err := c.GetACL(p)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		} else if err != nil {
			return err
		}
		if !sameACL(got, acl) {
			if _, err := c.SetACL(p, acl, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
				return err
			}
		}
		if !deep {
			continue
		}
		kids, _, err := c.Children(p)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		for _, k := range kids {
			queue = append(queue, p+"/"+k)
		}
	}
	return nil
}

// sameACL compares two ACLs as sets: Patroni lists its set_acls entries
// in its own order.
func sameACL(a, b []zk.ACL) bool {
	key := func(x zk.ACL) string { return x.Scheme + ":" + x.ID + ":" + itoa(int(x.Perms)) }
	ka, kb := make([]string, len(a)), make([]string, len(b))
	for i := range a {
		ka[i] = key(a[i])
	}
	for i := range b {
		kb[i] = key(b[i])
	}
	slices.Sort(ka)
	slices.Sort(kb)
	return slices.Equal(ka, kb)
}
