package workerproto

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// The worker side of reload-mode map delivery, shared by the router's
// map-file source and the Go worker helpers: load the map file named by
// SHARDVISOR_MAP_FILE whenever it changes (on the signal named by
// SHARDVISOR_MAP_SIGNAL, and by a stat every MapPollInterval in any case,
// so that a signal lost or sent before the handler existed costs at most
// one interval), and tell the supervisor MAPVERSION=N after each load.

// MapFollow says how this process gets new maps.
type MapFollow struct {
	Path   string         // the map file
	Reload bool           // SHARDVISOR_MAP_DELIVERY=reload: the file changes in place
	Signal syscall.Signal // 0: none named, poll only
}

// MapFollowFromEnv reads the supervisor's map delivery environment. ok is
// false when no map file was handed over.
func MapFollowFromEnv() (f MapFollow, ok bool) {
	f.Path = os.Getenv(EnvMapFile)
	if f.Path == "" {
		return f, false
	}
	f.Reload = os.Getenv(EnvMapDelivery) == MapDeliveryReload
	f.Signal, _ = MapSignal(os.Getenv(EnvMapSignal))
	return f, true
}

// MapSignal is the signal a pool's map_delivery.signal names (SIGHUP,
// SIGUSR1, SIGUSR2, SIGWINCH), for the supervisor that sends it and the
// worker that waits for it.
func MapSignal(name string) (syscall.Signal, bool) {
	sig, ok := map[string]syscall.Signal{"SIGHUP": syscall.SIGHUP, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2, "SIGWINCH": syscall.SIGWINCH}[name]
	return sig, ok
}

// FollowMapFile calls load with the file's contents each time it changes,
// until ctx ends. load returns the map version it now routes by (it may
// refuse a file, keeping the previous map: then nothing is acknowledged
// and the supervisor replaces the worker after its ack timeout). After
// each successful load, and once at the start for current (the version
// already loaded), MAPVERSION is sent on NOTIFY_SOCKET. onErr (may be
// nil) hears of files that could not be read or loaded.
//
// The signal handler is installed before the first acknowledgement, so
// the supervisor (which signals only workers it counts as ready) never
// finds the default action, which for SIGHUP and SIGUSR1/2 is to exit.
func FollowMapFile(ctx context.Context, f MapFollow, current uint64, load func([]byte) (uint64, error), onErr func(error)) {
	sigs := make(chan os.Signal, 1)
	if f.Signal != 0 {
		signal.Notify(sigs, f.Signal)
		defer signal.Stop(sigs)
	}
	ackMap(current)
	// The first tick reads the file again: it may have been replaced
	// between the caller's load and now.
	var last stamp
	tick := time.NewTicker(MapPollInterval)
	defer tick.Stop()
	for {
		forced := false
		select {
		case <-ctx.Done():
			return
		case <-sigs:
			forced = true
		case <-tick.C:
		}
		st, err := fileStamp(f.Path)
		if err != nil {
			if onErr != nil {
				onErr(err)
			}
			continue
		}
		if st == last && !forced {
			continue
		}
		data, err := os.ReadFile(f.Path)
		if err != nil {
			if onErr != nil {
				onErr(err)
			}
			continue
		}
		v, err := load(data)
		if err != nil {
			if onErr != nil {
				onErr(err)
			}
			last = st // do not retry the same bad file every interval
			continue
		}
		last = st
		ackMap(v)
	}
}

func ackMap(v uint64) {
	if v > 0 {
		_, _ = Notify(MapVersionAck(v))
	}
}

// stamp identifies one version of a file: the supervisor replaces it by a
// rename, so the inode changes with every write.
type stamp struct {
	ino   uint64
	size  int64
	mtime int64
}

func fileStamp(path string) (stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}, err
	}
	s := stamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s, nil
}
