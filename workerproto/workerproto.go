// Package workerproto is the one definition of the protocol between the
// supervisor and its workers, shared by the supervisor (the manager side),
// the Go worker helpers and the router's map-file source (the worker side):
//
//   - the environment a worker is started with (systemd's LISTEN_FDS,
//     LISTEN_FDNAMES, LISTEN_PID, NOTIFY_SOCKET, WATCHDOG_USEC and
//     WATCHDOG_PID, and shardvisor's SHARDVISOR_* names);
//   - sd_notify(3) datagrams (READY=1, WATCHDOG=1, STOPPING=1, RELOADING=1,
//     STATUS=...), sent and parsed;
//   - the watchdog interval a manager asked for.
//
// Workers in other languages speak the same protocol with their own
// systemd-aware servers (gunicorn, Puma, systemd-notify); docs/supervisor.md
// describes it for them.
package workerproto

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Environment variables the supervisor sets for each worker.
const (
	EnvListenFDs     = "LISTEN_FDS"     // number of inherited sockets, from fd 3
	EnvListenFDNames = "LISTEN_FDNAMES" // their names, ':'-separated
	EnvListenPID     = "LISTEN_PID"     // the pid the sockets are meant for
	EnvNotifySocket  = "NOTIFY_SOCKET"  // where sd_notify datagrams go
	EnvWatchdogUSec  = "WATCHDOG_USEC"  // watchdog interval in microseconds
	EnvWatchdogPID   = "WATCHDOG_PID"   // the pid the watchdog is meant for
	EnvMapFile       = "SHARDVISOR_MAP_FILE"
	EnvMapVersion    = "SHARDVISOR_MAP_VERSION"
	EnvGeneration    = "SHARDVISOR_GENERATION"
	EnvWorkerID      = "SHARDVISOR_WORKER_ID"
	// EnvMapDelivery is "reload" when the map file named by EnvMapFile is
	// rewritten in place for every new map (the worker reloads it and
	// acknowledges with MapVersionAck), "swap" when every new map comes
	// with a new worker generation instead.
	EnvMapDelivery = "SHARDVISOR_MAP_DELIVERY"
	// EnvMapSignal names the signal (SIGHUP, SIGUSR1...) the supervisor
	// sends after rewriting the map file in reload mode. Unset: the worker
	// watches the file (every MapPollInterval).
	EnvMapSignal = "SHARDVISOR_MAP_SIGNAL"
)

// Map delivery modes, as in EnvMapDelivery.
const (
	MapDeliverySwap   = "swap"
	MapDeliveryReload = "reload"
)

// MapPollInterval is how often a reload-mode worker with no map signal
// checks whether its map file changed (a stat; cheap enough for any
// language). Acknowledgements follow within this interval.
const MapPollInterval = 100 * time.Millisecond

// FirstListenFD is the first inherited socket's descriptor (SD_LISTEN_FDS_START).
const FirstListenFD = 3

// ProbeFDName is the LISTEN_FDNAMES name of the private socket on which
// the supervisor probes a worker over HTTP (a pool config's "probe"). It
// is always the last fd. A worker that serves every socket it is given
// answers there with no change.
const ProbeFDName = "shardvisor-probe"

// ReservedEnv lists the variables the supervisor sets for every worker. A
// pool config may not set them, and the supervisor drops them from its own
// environment before passing it on, so that its service manager's values
// never leak to a worker.
func ReservedEnv() []string {
	return []string{EnvListenFDs, EnvListenFDNames, EnvListenPID, EnvNotifySocket, EnvWatchdogUSec, EnvWatchdogPID,
		EnvMapFile, EnvMapVersion, EnvGeneration, EnvWorkerID, EnvMapDelivery, EnvMapSignal}
}

// IsReservedEnv reports whether name is one of ReservedEnv.
func IsReservedEnv(name string) bool {
	for _, r := range ReservedEnv() {
		if r == name {
			return true
		}
	}
	return false
}

// Notify messages.
const (
	Ready     = "READY=1"
	Watchdog  = "WATCHDOG=1"
	Stopping  = "STOPPING=1"
	Reloading = "RELOADING=1"
)

// Notify sends state (for example Ready, or "STATUS=booting") to the socket
// named by NOTIFY_SOCKET, as sd_notify(3) does. It returns false, nil when
// NOTIFY_SOCKET is unset: the process is not run by a notify-aware manager.
// A name starting with '@' is an abstract socket.
func Notify(state string) (bool, error) {
	addr := os.Getenv(EnvNotifySocket)
	if addr == "" {
		return false, nil
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("sd_notify to %s: %w", addr, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("sd_notify to %s: %w", addr, err)
	}
	return true, nil
}

// MapVersionAck is the notify message a worker sends once it routes by
// map version v: after loading a new map file in reload mode, and with
// READY=1 ("READY=1\nMAPVERSION=v") so the supervisor knows which map a
// new worker read.
func MapVersionAck(v uint64) string { return "MAPVERSION=" + strconv.FormatUint(v, 10) }

// RequestsReport is the notify message a worker sends to report how many
// requests it has served since it started (cumulative, not a delta): the
// supervisor replaces it gracefully once the count reaches the pool's
// max_requests. Send it now and then (package worker: at most every
// RequestsReportEvery), not per request.
func RequestsReport(n uint64) string { return "REQUESTS=" + strconv.FormatUint(n, 10) }

// RequestsReportEvery is how often a worker should at most report its
// request count: often enough that a limit is overshot by a fraction of a
// second of traffic, rarely enough to cost nothing.
const RequestsReportEvery = 100 * time.Millisecond

// Message is what one sd_notify datagram said. Unknown keys are ignored, as
// systemd does.
type Message struct {
	Ready, Watchdog, Stopping, Reloading bool
	Status                               string
	// MapVersion is MAPVERSION=N (0: absent or not a number).
	MapVersion uint64
	// Requests is REQUESTS=N, the worker's cumulative request count (0:
	// absent or not a number).
	Requests uint64
}

// ParseMessage parses one datagram: newline-separated KEY=VALUE lines.
func ParseMessage(b []byte) Message {
	var m Message
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "READY":
			m.Ready = v == "1"
		case "WATCHDOG":
			m.Watchdog = v == "1"
		case "STOPPING":
			m.Stopping = v == "1"
		case "RELOADING":
			m.Reloading = v == "1"
		case "STATUS":
			m.Status = v
		case "MAPVERSION":
			m.MapVersion, _ = strconv.ParseUint(v, 10, 64)
		case "REQUESTS":
			m.Requests, _ = strconv.ParseUint(v, 10, 64)
		}
	}
	return m
}

// WatchdogInterval is the interval this process's manager asked for
// (WATCHDOG_USEC), or 0 when it asked for none or asked another process
// (WATCHDOG_PID set to a pid not ours). Send Watchdog at half of it, as
// sd_watchdog_enabled(3) advises. strictPID requires WATCHDOG_PID to be set:
// a worker started by the supervisor always has it, while systemd may leave
// it out for the main process.
func WatchdogInterval(strictPID bool) time.Duration {
	usec, err := strconv.ParseInt(os.Getenv(EnvWatchdogUSec), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	pid := os.Getenv(EnvWatchdogPID)
	if pid == "" && !strictPID {
		return time.Duration(usec) * time.Microsecond
	}
	if pid != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond
}

// ListenFDs returns how many sockets this process inherited and their
// names (LISTEN_FDNAMES, possibly shorter than the count), or 0 when
// LISTEN_PID names another process or nothing was passed.
func ListenFDs() (int, []string) {
	if os.Getenv(EnvListenPID) != strconv.Itoa(os.Getpid()) {
		return 0, nil
	}
	n, err := strconv.Atoi(os.Getenv(EnvListenFDs))
	if err != nil || n <= 0 {
		return 0, nil
	}
	var names []string
	if s := os.Getenv(EnvListenFDNames); s != "" {
		names = strings.Split(s, ":")
	}
	return n, names
}
