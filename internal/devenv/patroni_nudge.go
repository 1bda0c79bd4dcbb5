package devenv

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"regexp"
	"time"

	"github.com/go-zookeeper/zk"
)

// Patroni 3.0.2 (Debian's) can wait for ever to rewind a returning old
// primary: "Waiting for checkpoint on <leader> before rewind" every loop,
// although the leader's member record in ZooKeeper no longer carries
// checkpoint_after_promote. Its ZooKeeper cache reloads only when a watched
// znode changes (the members' list, config, sync, history, failover), and
// the leader can publish the end of its checkpoint with a plain set of its
// member znode when a concurrent REST request reloaded the leader's cache
// between its own delete and create of that znode. Nothing watched changes
// after that, so the member's cache stays stale. Seen in this repository's
// fault tests after a pg-kill and an immediate pg-start (40 minutes once).
//
// The nudge rewrites /service/pgI/config with its own bytes: a watched
// znode changes, every member reloads the cluster, and the configuration is
// what it was (Patroni compares contents). docs/failover.md gives operators
// the same step.

// staleRewindAfter is how long a member may wait for a checkpoint the
// leader has already announced before the nudge.
const staleRewindAfter = 10 * time.Second

var waitingForCheckpoint = regexp.MustCompile(`Waiting for checkpoint on (\S+) before rewind\n(?:[^\n]*\n){0,80}$`)

// waitingOn is the leader a member's Patroni log says it waits for (in the
// last lines), or "".
func waitingOn(logTail []byte) string {
	if m := waitingForCheckpoint.FindSubmatch(logTail); m != nil {
		return string(m[1])
	}
	return ""
}

// checkpointAnnounced: the leader's member record says its checkpoint after
// promotion is done (a primary without checkpoint_after_promote: false).
func checkpointAnnounced(record []byte) bool {
	var d map[string]any
	if json.Unmarshal(record, &d) != nil {
		return false
	}
	role, _ := d["role"].(string)
	_, pending := d["checkpoint_after_promote"]
	return (role == "master" || role == "primary") && !pending
}

// readTail is the last n bytes of a file.
func readTail(path string, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return b
}

// nudgeStaleRewind nudges group i when a member has waited for a checkpoint
// the leader already announced; it reports whether it did.
func (e *Env) nudgeStaleRewind(i int, ms []member) bool {
	var leader string
	for _, m := range ms {
		if l := waitingOn(readTail(e.MemberDir(i, m.m)+"/patroni.log", 16<<10)); l != "" {
			leader = l
			break
		}
	}
	if leader == "" {
		return false
	}
	c, err := e.zkConnected(5 * time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	ns := PatroniNamespace + "pg" + itoa(i)
	rec, _, err := c.Get(ns + "/members/" + leader)
	if err != nil || !checkpointAnnounced(rec) {
		return false
	}
	cfg, st, err := c.Get(ns + "/config")
	if err != nil {
		return false
	}
	// A version mismatch means someone else changed it: that reloads too.
	if _, err := c.Set(ns+"/config", cfg, st.Version); err != nil && !errors.Is(err, zk.ErrBadVersion) {
		return false
	}
	e.logf("pg%d: a member waits for a checkpoint %s has announced (Patroni 3.0.2's stale cache): rewrote %s/config unchanged so every member reloads", i, leader, ns)
	return true
}
