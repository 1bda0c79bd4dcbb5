package devenv

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Each member's Patroni reaches ZooKeeper server J through a forwarder of
// its own (socat) on ZKLinkPort(I, M, J): ZKCut stops member M's forwarders
// (its sessions' connections are cut, new ones refused) to partition it
// from ZooKeeper while PostgreSQL and its REST API stay reachable; ZKHeal
// restores them. The forwarders outlive Patroni (they stand in for the
// network).

func (e *Env) zkLinkPid(i, m, j int) int {
	pid := readPid(e.zkLinkPidFile(i, m, j))
	if pid == 0 || !Alive(pid, "socat") {
		return 0
	}
	return pid
}

// zkLinkStart starts member m's forwarders that are not running.
func (e *Env) zkLinkStart(i, m int) error {
	if e.c.Hosts != nil {
		return nil // the member dials ZooKeeper's hosts itself
	}
	for j := 1; j <= ZKServers; j++ {
		if e.zkLinkPid(i, m, j) != 0 {
			continue
		}
		port := e.ZKLinkPort(i, m, j)
		if !e.portFreed("", port, 5*time.Second) {
			return fmt.Errorf("pg%d.m%d: ZooKeeper link port %d on 127.0.0.1 is already in use (see: ss -ltnp)", i, m, port)
		}
		// A session of its own: the forwarder leads its process group, with
		// the children it forks per connection, so zkLinkStop cuts them all.
		cmd := exec.Command("socat", fmt.Sprintf("TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork", port), fmt.Sprintf("TCP:127.0.0.1:%d", e.ZKPort(j)))
		pid, err := startDaemon(cmd, nil)
		if err != nil {
			return fmt.Errorf("pg%d.m%d: ZooKeeper link %d: %w", i, m, j, err)
		}
		if err := writePid(e.zkLinkPidFile(i, m, j), pid); err != nil {
			return err
		}
		for deadline := time.Now().Add(2 * time.Second); !e.portBusy("", port) && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// zkLinkStop stops member m's forwarders and every connection through
// them, all at once, and returns when they are gone and their ports free
// (a heal right after the cut must find them free).
func (e *Env) zkLinkStop(i, m int) {
	var pids []int
	for j := 1; j <= ZKServers; j++ {
		if pid := e.zkLinkPid(i, m, j); pid != 0 {
			if syscall.Kill(-pid, syscall.SIGKILL) != nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			pids = append(pids, pid)
		}
		_ = os.Remove(e.zkLinkPidFile(i, m, j))
	}
	waitGone(pids...)
	for j := 1; j <= ZKServers; j++ {
		e.portFreed("", e.ZKLinkPort(i, m, j), 5*time.Second)
	}
}

// memberArg checks that node i is a group with a member m.
func (e *Env) memberArg(i, m int) error {
	if !e.IsGroup(i) {
		return fmt.Errorf("pg%d is not a Patroni group", i)
	}
	if n, _, err := e.recordedMembers(i); err != nil || m < 1 || m > n {
		return fmt.Errorf("expected a member number of pg%d, got '%d'", i, m)
	}
	return nil
}

// ZKCut cuts member m of group i off from ZooKeeper: its Patroni's
// connections to the ensemble are cut and new ones refused, while its
// PostgreSQL and REST API still answer.
func (e *Env) ZKCut(i, m int) error {
	if err := e.memberArg(i, m); err != nil {
		return err
	}
	return e.locked(func() error {
		e.zkLinkStop(i, m)
		e.logf("pg%d.m%d: cut off from ZooKeeper (its PostgreSQL and REST API still answer)", i, m)
		return nil
	})
}

// ZKHeal lets member m of group i reach ZooKeeper again.
func (e *Env) ZKHeal(i, m int) error {
	if err := e.memberArg(i, m); err != nil {
		return err
	}
	return e.locked(func() error {
		if err := e.zkLinkStart(i, m); err != nil {
			return err
		}
		e.logf("pg%d.m%d: reaches ZooKeeper again", i, m)
		return nil
	})
}
