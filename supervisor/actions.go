package supervisor

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
)

// An action is one thing the machine decided and the executor does to the
// world: processes, sockets, files, ZooKeeper, the service manager. The
// machine never does any of it itself, so its decisions can be tested as
// values (reconcile_test.go); String is the form those tests compare.
type action interface{ String() string }

type (
	// actPrepare binds the generation's listen sockets (reusing those
	// already bound) and writes its map file. On failure the executor
	// reports back (machine.prepareFailed) before the next action.
	actPrepare struct{ g *generation }
	// actStart forks and execs a worker of w.gen. On failure the executor
	// reports back (machine.startFailed); a start the machine has dropped
	// meanwhile is skipped (machine.skip).
	actStart struct{ w *worker }
	// actTerm sends SIGTERM to the worker: drain and exit.
	actTerm struct{ w *worker }
	// actQuit sends SIGQUIT (the watchdog's stack dump request).
	actQuit struct{ w *worker }
	// actKill sends SIGKILL to the worker and its process group.
	actKill struct{ w *worker }
	// actProbeNow tells the worker's probe that it said READY=1: probe it
	// at once, and report a failure before its first pass (probe.go).
	actProbeNow struct{ w *worker }
	// actCloseSockets closes every bound socket whose address is not in
	// keep (nil: all of them).
	actCloseSockets struct{ keep map[string]bool }
	// actCleanMapFiles removes the map files of versions not in keep.
	actCleanMapFiles struct{ keep map[uint64]bool }
	// actPublish records a swap result (/status, and the pool status
	// record in ZooKeeper mode).
	actPublish struct{ st topo.PoolStatus }
	// actNotify tells the supervisor's own service manager (sd_notify).
	actNotify struct{ state string }
	// actReload re-reads config and map off the loop and posts them with
	// force set (HUP).
	actReload struct{}
	// actResync re-reads config and map off the loop after a session
	// loss and posts an evResync.
	actResync struct{}
	// actCheckPeers asks the peers off the loop whether they reach
	// ZooKeeper and posts an evPeers.
	actCheckPeers struct{}
	// actWriteLiveMap (reload mode) replaces the live map file with mp,
	// atomically. On failure the executor reports back
	// (machine.liveMapFailed) before the next action.
	actWriteLiveMap struct{ mp *mapData }
	// actMapSignal (reload mode) sends the pool's map signal to the
	// worker's main process: the live map file changed.
	actMapSignal struct {
		w       *worker
		sig     string
		version uint64
	}
	// actStartUpgrade starts the new binary with the handover (SIGUSR2,
	// upgrade.go). On success the executor reports the new supervisor's
	// pid (machine.upgradeStarted); it reports its readiness, failure
	// and exit as events.
	actStartUpgrade struct{}
	// actStopUpgrade stops the new supervisor of a failed upgrade
	// (SIGTERM, SIGKILL after the upgrade timeout), or withThis, one that
	// has not taken over when this one stops (SIGTERM).
	actStopUpgrade struct {
		pid      int
		withThis bool
	}
	// actHandOver makes this, the old supervisor, give way to the new
	// one, which is serving: no more word to systemd, the unix socket
	// files are the new one's, and the admin address is served by the
	// new one alone. The machine's graceful stop follows.
	actHandOver struct{ pid int }
	// actTakeOver makes this, the new supervisor of an upgrade, take
	// over once generation gen is established: it serves the admin
	// address, tells systemd, and tells the old one to drain.
	actTakeOver struct{ gen int64 }
)

func (a actPrepare) String() string  { return fmt.Sprintf("prepare g%d", a.g.id) }
func (a actStart) String() string    { return fmt.Sprintf("start w%d g%d", a.w.id, a.w.gen.id) }
func (a actTerm) String() string     { return fmt.Sprintf("term w%d %s", a.w.id, a.w.stopReason) }
func (a actQuit) String() string     { return fmt.Sprintf("quit w%d", a.w.id) }
func (a actKill) String() string     { return fmt.Sprintf("kill w%d %s", a.w.id, a.w.stopReason) }
func (a actProbeNow) String() string { return fmt.Sprintf("probe w%d", a.w.id) }
func (a actCloseSockets) String() string {
	if a.keep == nil {
		return "close-sockets all"
	}
	return "close-sockets keep " + strings.Join(slices.Sorted(maps.Keys(a.keep)), ",")
}
func (a actCleanMapFiles) String() string {
	vs := make([]string, 0, len(a.keep))
	for v := range a.keep {
		vs = append(vs, fmt.Sprint(v))
	}
	sort.Strings(vs)
	return "clean-maps keep " + strings.Join(vs, ",")
}
func (a actPublish) String() string {
	return fmt.Sprintf("publish %s g%d", a.st.Result, a.st.Generation)
}
func (a actNotify) String() string   { return "notify " + strings.ReplaceAll(a.state, "\n", " ") }
func (actReload) String() string     { return "reload" }
func (actResync) String() string     { return "resync" }
func (actCheckPeers) String() string { return "check-peers" }
func (a actWriteLiveMap) String() string {
	return fmt.Sprintf("write-live-map m%d", a.mp.version)
}

func (actStartUpgrade) String() string { return "upgrade-start" }
func (a actStopUpgrade) String() string {
	if a.withThis {
		return fmt.Sprintf("upgrade-stop p%d with-this", a.pid)
	}
	return fmt.Sprintf("upgrade-stop p%d", a.pid)
}
func (a actHandOver) String() string { return fmt.Sprintf("hand-over p%d", a.pid) }
func (a actTakeOver) String() string { return fmt.Sprintf("take-over g%d", a.gen) }

// signal is the named signal (0 for a name topo's validation let through
// but workerproto cannot send, which TestMapSignalsCoverTheConfigsChoices
// rules out).
func (a actMapSignal) signal() syscall.Signal {
	sig, _ := workerproto.MapSignal(a.sig)
	return sig
}

func (a actMapSignal) String() string {
	return fmt.Sprintf("map-signal w%d %s m%d", a.w.id, a.sig, a.version)
}
