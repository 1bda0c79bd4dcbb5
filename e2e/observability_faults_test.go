package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/failpoint"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// quiet waits until none of the three alerts is active, so that each
// fault's times are its own.
func (o *obs) quiet(t *testing.T) {
	t.Helper()
	for _, a := range []string{alertFrozen, alertMemberGone, alertNoSyncStand} {
		o.awaitAlert(t, a, "inactive", time.Now(), 90*time.Second)
	}
}

// frozenBucket: a mover SIGKILLed on entering its barrier, inside the
// write pause (the bucket refused on every node), by the failpoint
// move:barrier of a -tags failpoints build. Its ZooKeeper session is the
// longest ZooKeeper grants (30 s, maxSessionTimeout): its runner lock
// lives that long, and the bucket stays frozen until rebalance --watch,
// which follows the move (its frozen-bucket gauge is the alert's metric),
// takes the move over once the lock is gone and rolls it back: the heal.
//
// The bucket goes from the node with the most buckets to the one with
// the fewest, which leaves the cluster balanced: a move that unbalanced
// it had rebalance --watch start a move of its own meanwhile, whose newer
// map version the source's fence then held up against this one's, and
// this move aborted before its pause instead of being killed in it
// (failed in CI once).
func (o *obs) frozenBucket(t *testing.T) {
	o.quiet(t)
	from, to := o.fullestAndEmptiest(t)
	var bucket uint32
	found := false
	for i := 0; i < 5000 && !found; i++ {
		node, b, err := o.routeOf(fmt.Sprintf("frozen-%d", i))
		if err != nil {
			t.Fatalf("route: %v", err)
		}
		if node == from {
			bucket, found = b, true
		}
	}
	if !found {
		t.Fatalf("no user routes to %s", from)
	}
	before := map[string]bool{}
	for _, m := range o.moves() {
		before[m.ID] = true
	}
	c := exec.Command(filepath.Join(o.fpBin, "shardctl"), "--zk-session-timeout", "30s", "move", strconv.Itoa(int(bucket)), "--to", to, "--window", "0")
	c.Env = append(append(os.Environ(), o.envv...), failpoint.Env+"=move:barrier")
	out, err := c.CombinedOutput()
	fault := time.Now()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != -1 {
		t.Fatalf("the mover of bucket %d was not killed in its write pause: %v\n%s", bucket, err, out)
	}
	var id string
	for _, m := range o.moves() {
		if !before[m.ID] && m.Bucket == bucket {
			id = m.ID
		}
	}
	if id == "" {
		t.Fatalf("no new move of bucket %d after the kill\n%s", bucket, out)
	}
	t.Logf("fault: mover of move %s (bucket %d %s -> %s) killed in its write pause", id, bucket, from, to)
	// It must fire while the bucket is frozen: before the dead mover's
	// session (30 s) expires and the watcher rolls the move back.
	toFiring := o.awaitAlert(t, alertFrozen, "firing", fault, 30*time.Second)
	resolved := o.alertAt(alertFrozen, "inactive", 2*time.Minute)
	var rec moveRec
	if !waitUntil(90*time.Second, func() bool {
		for _, m := range o.moves() {
			if m.ID == id {
				rec = m
			}
		}
		return topo.MoveStateFinal(rec.State)
	}) {
		t.Fatalf("move %s still %q 90 s after its mover died: rebalance --watch did not take it over", id, rec.State)
	}
	healed := time.Now() // seen: `shardctl moves` polled, about every 0.5 s
	at := o.resolvedAt(t, alertFrozen, resolved)
	t.Logf("%s: fault -> firing %.1f s; heal (move %s %s by rebalance --watch, seen %.1f s after the fault) -> resolved %+.1f s (%.1f s after the fault)",
		alertFrozen, toFiring.Seconds(), id, rec.State, healed.Sub(fault).Seconds(), at.Sub(healed).Seconds(), at.Sub(fault).Seconds())
	o.report(alertFrozen, toFiring, at.Sub(healed), "move rolled back by rebalance --watch, seen")
}

// fullestAndEmptiest names the active node with the most buckets and the
// one with the fewest (by ID among equals): a move between them keeps a
// cluster balanced within one bucket balanced.
func (o *obs) fullestAndEmptiest(t *testing.T) (from, to string) {
	t.Helper()
	out, err := o.cmd("shardctl", "status", "--json").Output()
	if err != nil {
		t.Fatalf("shardctl status --json: %v", err)
	}
	var s bucketmap.Summary
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("shardctl status --json: %v\n%s", err, out)
	}
	var most, least *bucketmap.NodeSummary
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if n.State != bucketmap.NodeActive {
			continue
		}
		if most == nil || n.Buckets > most.Buckets || (n.Buckets == most.Buckets && n.ID < most.ID) {
			most = n
		}
		if least == nil || n.Buckets < least.Buckets || (n.Buckets == least.Buckets && n.ID < least.ID) {
			least = n
		}
	}
	if most == nil || most == least {
		t.Fatalf("no two active nodes to move between: %+v", s.Nodes)
	}
	return string(most.ID), string(least.ID)
}

// memberMissing: the group's synchronous standby stopped by its pid
// (SIGTERM to its Patroni, which stops its PostgreSQL and exits), then
// started again (testenv's StartMembers: devenv's pg-start). Its member
// record outlives it by about its ZooKeeper session's timeout (Patroni's
// ttl, 10 s here), which the time to firing includes.
func (o *obs) memberMissing(t *testing.T) {
	o.quiet(t)
	g := o.group
	standby := 3 - g.PrimaryMember(t) // two members
	patroni, postmaster := o.stopMember(t, standby)
	fault := time.Now()
	t.Logf("fault: %s member %d stopped (Patroni pid %d, postmaster pid %d)", g.Name, standby, patroni, postmaster)
	toFiring := o.awaitAlert(t, alertMemberGone, "firing", fault, 60*time.Second)
	if st, _ := o.alertState(alertNoSyncStand); st != "inactive" {
		t.Logf("%s is %s too (the stopped member was the synchronous standby)", alertNoSyncStand, st)
	}
	heal := time.Now()
	resolved := o.alertAt(alertMemberGone, "inactive", 3*time.Minute)
	g.StartMembers(t)
	streaming := time.Now()
	at := o.resolvedAt(t, alertMemberGone, resolved)
	t.Logf("%s: fault -> firing %.1f s; heal (member %d started: devenv pg-start; streaming again %.1f s later) -> resolved %.1f s",
		alertMemberGone, toFiring.Seconds(), standby, streaming.Sub(heal).Seconds(), at.Sub(heal).Seconds())
	o.report(alertMemberGone, toFiring, at.Sub(heal), "member started again")
}

// stopMember stops member m of the group by its pids: SIGTERM to its
// Patroni, which stops its PostgreSQL (fast) and exits; it returns once
// both are gone.
func (o *obs) stopMember(t *testing.T, m int) (patroni, postmaster int) {
	t.Helper()
	dir := filepath.Join(testenv.StateDir(), "pg", o.group.Name, "m"+strconv.Itoa(m))
	patroni = pidIn(t, filepath.Join(dir, "patroni.pid"))
	postmaster = pidIn(t, filepath.Join(dir, "data", "postmaster.pid"))
	if err := syscall.Kill(patroni, syscall.SIGTERM); err != nil {
		t.Fatalf("stopping %s member %d's Patroni (pid %d): %v", o.group.Name, m, patroni, err)
	}
	if !waitUntil(60*time.Second, func() bool { return gone(patroni) && gone(postmaster) }) {
		t.Fatalf("%s member %d: Patroni (pid %d) or its postmaster (pid %d) still runs 60 s after SIGTERM", o.group.Name, m, patroni, postmaster)
	}
	return patroni, postmaster
}

// pidIn reads the pid on the first line of a pid file.
func pidIn(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pid <= 0 {
		t.Fatalf("%s: no pid (%q)", path, b)
	}
	return pid
}

// gone reports whether pid no longer runs (or is a zombie of another
// parent: it runs no more).
func gone(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'Z'
}

// noSyncStandby: the group's standby keeps running and streaming but no
// longer qualifies as synchronous: its Patroni's configuration gets the
// tag nosync (Patroni's own way to say "never pick this one"), read again
// on SIGHUP, so that the leader clears synchronous_standby_names and its
// sync record while synchronous_mode stays on. Healed by the configuration
// as it was, read again. (Stopping the standby would do too, but that is
// the missing member's fault: this one leaves every member registered.)
func (o *obs) noSyncStandby(t *testing.T) {
	o.quiet(t)
	g := o.group
	standby := 3 - g.PrimaryMember(t) // two members
	dir := filepath.Join(testenv.StateDir(), "pg", g.Name, "m"+strconv.Itoa(standby))
	conf := filepath.Join(dir, "patroni.yml")
	orig, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(orig), "\ntags:") {
		t.Fatalf("%s has tags already: the fault would change them", conf)
	}
	patroni := pidIn(t, filepath.Join(dir, "patroni.pid"))
	reload := func(b []byte) error {
		if err := os.WriteFile(conf, b, 0o600); err != nil {
			return err
		}
		return syscall.Kill(patroni, syscall.SIGHUP)
	}
	restored := false
	t.Cleanup(func() {
		if !restored {
			if err := reload(orig); err != nil {
				t.Errorf("restoring %s: %v", conf, err)
			}
		}
	})
	tagged := strings.TrimRight(string(orig), "\n") + "\n# TestFaultsObservability: the standby never synchronous\ntags:\n  nosync: true\n"
	if err := reload([]byte(tagged)); err != nil {
		t.Fatalf("tagging %s nosync: %v", conf, err)
	}
	fault := time.Now()
	t.Logf("fault: %s member %d tagged nosync (its Patroni, pid %d, read its configuration again)", g.Name, standby, patroni)
	toFiring := o.awaitAlert(t, alertNoSyncStand, "firing", fault, 60*time.Second)
	if st, _ := o.alertState(alertMemberGone); st != "inactive" {
		t.Errorf("%s is %s: the nosync standby should stay registered", alertMemberGone, st)
	}
	resolved := o.alertAt(alertNoSyncStand, "inactive", 2*time.Minute)
	heal := time.Now()
	if err := reload(orig); err != nil {
		t.Fatalf("restoring %s: %v", conf, err)
	}
	restored = true
	at := o.resolvedAt(t, alertNoSyncStand, resolved)
	t.Logf("%s: fault -> firing %.1f s; heal (the tag removed, read again) -> resolved %.1f s", alertNoSyncStand, toFiring.Seconds(), at.Sub(heal).Seconds())
	o.report(alertNoSyncStand, toFiring, at.Sub(heal), "tag removed")
}

// report keeps an alert's times for the summary line at the end.
func (o *obs) report(alert string, firing, resolved time.Duration, heal string) {
	o.summary = append(o.summary, fmt.Sprintf("%s: fault -> firing %.1f s, heal (%s) -> resolved %+.1f s (%s)",
		alert, firing.Seconds(), heal, resolved.Seconds(), o.forOf(alert)))
}
