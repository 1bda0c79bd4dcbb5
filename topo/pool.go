package topo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardvisor/shardvisor/workerproto"
)

// Record format versions of the supervisor's records.
const (
	PoolConfigVersion = 1
	PoolStatusVersion = 1
	PoolMemberVersion = 1
)

// Defaults of PoolConfig fields left zero or omitted. docs/supervisor.md
// lists the same values for operators.
const (
	DefaultGracefulTimeout  = 30 * time.Second
	DefaultReadinessTimeout = 60 * time.Second
	DefaultReadinessDelay   = 2 * time.Second
	DefaultRestartInitial   = 1 * time.Second
	DefaultRestartMax       = 30 * time.Second
	// DefaultMapAckTimeout is how long a reload-mode worker has to
	// acknowledge a new map before it is replaced.
	DefaultMapAckTimeout = 5 * time.Second
	// DefaultStabilityWindow is how long a new config's workers must stay
	// ready before the previous generation is retired (Nomad's
	// min_healthy_time has the same default, for the same reason: most
	// crashes of a bad deploy come in its first seconds).
	DefaultStabilityWindow = 10 * time.Second
	// DefaultRollbackWithin is how long after a new config took over a
	// crash loop of its workers still rolls the pool back.
	DefaultRollbackWithin = 60 * time.Second
	// Probe defaults (PoolConfig.Probe).
	DefaultProbeInterval = 2 * time.Second
	DefaultProbeTimeout  = time.Second
	DefaultProbeFailures = 3
	// MaxWorkers bounds workers (and surge) so that a typo cannot fork
	// thousands of processes.
	MaxWorkers = 1024
)

// Readiness modes.
const (
	ReadinessNotify = "notify" // ready when the worker sends READY=1 on NOTIFY_SOCKET
	ReadinessTimer  = "timer"  // ready after readiness.delay alive
)

// Map delivery modes (PoolConfig.MapDelivery.Mode).
const (
	// MapDeliverySwap starts a new worker generation for every new map
	// (the default: it works with any worker).
	MapDeliverySwap = "swap"
	// MapDeliveryReload rewrites the workers' map file in place and tells
	// the live workers (a signal, or the file's change); each acknowledges
	// with MAPVERSION=N on its notify socket. No worker restarts.
	MapDeliveryReload = "reload"
)

// MapSignals are the signals a reload-mode pool may name: those a worker
// can catch and whose default action is not something a worker relies on
// (SIGTERM, SIGQUIT and SIGINT stop it; SIGTTIN/SIGTTOU are the
// supervisor's own).
var MapSignals = []string{"SIGHUP", "SIGUSR1", "SIGUSR2", "SIGWINCH"}

// Duration is a time.Duration written in JSON as a Go duration string
// ("30s", "1m30s"), so hand-edited records stay readable. A bare number is
// rejected rather than guessed to be nanoseconds or seconds.
type Duration time.Duration

func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"30s\", not %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %v", s, err)
	}
	*d = Duration(v)
	return nil
}

// ByteSize is a number of bytes written in JSON as a string with a unit
// ("512MiB", "2GiB", "500MB"), so hand-edited records stay readable and a
// bare number cannot be misread as kilobytes or pages.
type ByteSize int64

// byteUnits are the units ParseByteSize accepts, longest first.
var byteUnits = []struct {
	name string
	n    int64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"kB", 1e3}, {"KB", 1e3}, {"B", 1},
}

// ParseByteSize parses a whole number and a unit: B, kB (or KB), MB, GB,
// TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024).
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	for _, u := range byteUnits {
		num, ok := strings.CutSuffix(t, u.name)
		if !ok {
			continue
		}
		num = strings.TrimSpace(num)
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("size %q: %q is not a whole number of %s (write \"1536MiB\", not \"1.5GiB\")", s, num, u.name)
		}
		if n > math.MaxInt64/u.n {
			return 0, fmt.Errorf("size %q is too large", s)
		}
		return ByteSize(n * u.n), nil
	}
	return 0, fmt.Errorf("size %q needs a unit: B, kB, MB, GB, TB, KiB, MiB, GiB or TiB (as in \"512MiB\")", s)
}

// String is the size in the largest binary unit that divides it.
func (b ByteSize) String() string {
	for _, u := range byteUnits[:4] {
		if b != 0 && int64(b)%u.n == 0 {
			return strconv.FormatInt(int64(b)/u.n, 10) + u.name
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

func (b ByteSize) MarshalJSON() ([]byte, error) { return json.Marshal(b.String()) }

func (b *ByteSize) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("size must be a string with a unit such as \"512MiB\", not %s", data)
	}
	v, err := ParseByteSize(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// MinMaxMemory is the smallest max_memory a pool may set: below it every
// worker would be replaced as soon as it is ready.
const MinMaxMemory = ByteSize(16 << 20)

// PoolConfig is a supervisor pool's config, stored at Paths.PoolConfig and
// written by `shardctl pool set` with compare-and-swap. Fields that are zero
// or omitted take the defaults above (see Effective).
type PoolConfig struct {
	Version int `json:"version"`
	// Command is the worker executable: a path, or a name looked up in PATH
	// (the worker's PATH when env sets one).
	Command string            `json:"command"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// Dir is the worker's working directory ("" = the supervisor's).
	Dir     string   `json:"dir,omitempty"`
	Workers int      `json:"workers"`
	Listen  []Listen `json:"listen,omitempty"`
	// GracefulTimeout is the time between SIGTERM and SIGKILL.
	GracefulTimeout Duration  `json:"graceful_timeout,omitempty"`
	Readiness       Readiness `json:"readiness,omitempty"`
	// Surge is how many workers beyond Workers may run during a swap.
	// Omitted means Workers (start a whole new generation at once).
	Surge   *int    `json:"surge,omitempty"`
	Restart Backoff `json:"restart,omitempty"`
	// MaxLifetime recycles a worker (gracefully, after its replacement is
	// ready) once it has run this long plus a random part of
	// MaxLifetimeJitter. 0 = never.
	MaxLifetime       Duration `json:"max_lifetime,omitempty"`
	MaxLifetimeJitter Duration `json:"max_lifetime_jitter,omitempty"`
	// MaxRequests recycles a worker (gracefully, as MaxLifetime) once the
	// request count it reports (REQUESTS=N on its notify socket) reaches
	// MaxRequests plus a random part of MaxRequestsJitter. 0 = never.
	MaxRequests       int64 `json:"max_requests,omitempty"`
	MaxRequestsJitter int64 `json:"max_requests_jitter,omitempty"`
	// MaxMemory recycles a worker (gracefully, as MaxLifetime) once the
	// resident memory of its process tree exceeds it. 0 = never.
	MaxMemory ByteSize `json:"max_memory,omitempty"`
	// Watchdog, when set, is passed as WATCHDOG_USEC; a ready worker that
	// sends no WATCHDOG=1 for this long gets SIGQUIT, then SIGKILL.
	Watchdog Duration `json:"watchdog,omitempty"`
	// MapDelivery says how workers get a new bucket map.
	MapDelivery MapDelivery `json:"map_delivery,omitempty"`
	// Stability guards a config change against a config that crashes
	// after its workers said READY=1.
	Stability Stability `json:"stability,omitempty"`
	// Probe, when set, is an HTTP check of every worker on a private
	// socket of its own (a ready worker that stops answering is replaced).
	Probe *WorkerProbe `json:"probe,omitempty"`
}

// Stability is how a swap to a new config proves itself. Nil fields take
// the defaults; "0s" turns a check off.
type Stability struct {
	// Window: the new config's workers must stay ready this long before
	// the previous generation is retired, and a crash of one of them
	// inside it rolls the swap back (the previous generation never
	// stopped serving). Default DefaultStabilityWindow.
	Window *Duration `json:"window,omitempty"`
	// RollbackWithin: for this long after the new config took over, a
	// crash loop of its workers (as many crashes as the pool has workers,
	// at least 2) restarts the previous config at once. Default
	// DefaultRollbackWithin.
	RollbackWithin *Duration `json:"rollback_within,omitempty"`
}

// WindowD is the effective stability window (Effective fills it in).
func (s Stability) WindowD() time.Duration {
	if s.Window == nil {
		return DefaultStabilityWindow
	}
	return s.Window.D()
}

// RollbackWithinD is the effective rollback period.
func (s Stability) RollbackWithinD() time.Duration {
	if s.RollbackWithin == nil {
		return DefaultRollbackWithin
	}
	return s.RollbackWithin.D()
}

// WorkerProbe is an HTTP check of each worker. The supervisor binds a private
// loopback socket per worker and passes it as the last of LISTEN_FDS,
// named ProbeFDName; a worker that serves every socket it is given
// (gunicorn, Puma, package worker) answers there unchanged. A worker
// becomes ready only once the probe answers 2xx too, and a ready worker
// whose probe fails Failures times in a row is replaced, as one whose
// watchdog expired.
type WorkerProbe struct {
	// Path is the HTTP path probed ("/healthz").
	Path     string   `json:"path"`
	Interval Duration `json:"interval,omitempty"`
	Timeout  Duration `json:"timeout,omitempty"`
	Failures int      `json:"failures,omitempty"`
}

// MapDelivery is how a new bucket map reaches a pool's workers.
type MapDelivery struct {
	// Mode is "swap" (default) or "reload".
	Mode string `json:"mode,omitempty"`
	// Signal (reload mode) is sent to each worker's main process after the
	// map file changed, for workers that wait for one. Empty: workers
	// watch the file themselves (workerproto.MapPollInterval).
	Signal string `json:"signal,omitempty"`
	// AckTimeout (reload mode) is how long a ready worker may take to
	// answer MAPVERSION=N for a new map before it is replaced by a new
	// worker, which starts with the new map (default 5s).
	AckTimeout Duration `json:"ack_timeout,omitempty"`
}

// Reload reports whether the pool takes new maps in place.
func (d MapDelivery) Reload() bool { return d.Mode == MapDeliveryReload }

// Listen is one socket the supervisor binds and passes to every worker.
type Listen struct {
	// Name is passed in LISTEN_FDNAMES.
	Name string `json:"name"`
	// Addr is "tcp://host:port" (also tcp4://, tcp6://) or
	// "unix:///absolute/path.sock".
	Addr string `json:"addr"`
}

// Readiness says when a new worker counts as ready.
type Readiness struct {
	Mode    string   `json:"mode,omitempty"`    // notify (default) or timer
	Timeout Duration `json:"timeout,omitempty"` // notify: give up after this long
	// Delay: in timer mode, ready after this long alive; in notify mode,
	// extra settle time after READY=1 (for servers such as gunicorn whose
	// master notifies before its own workers are forked).
	Delay Duration `json:"delay,omitempty"`
}

// Backoff is the respawn delay after a crash: Initial, doubling up to Max,
// with jitter.
type Backoff struct {
	Initial Duration `json:"initial,omitempty"`
	Max     Duration `json:"max,omitempty"`
}

var (
	fdNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,255}$`)
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// ParseListenAddr splits a listen address into a net.Listen network and
// address: "tcp://127.0.0.1:8080" -> ("tcp", "127.0.0.1:8080"),
// "unix:///run/app.sock" -> ("unix", "/run/app.sock").
func ParseListenAddr(s string) (network, address string, err error) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return "", "", fmt.Errorf("listen address %q needs a scheme: tcp://host:port or unix:///path.sock", s)
	}
	switch scheme {
	case "tcp", "tcp4", "tcp6":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return "", "", fmt.Errorf("listen address %q: %v", s, err)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return "", "", fmt.Errorf("listen address %q: port %q is not a number 0-65535", s, port)
		}
		if host != "" && net.ParseIP(host) == nil && host != "localhost" {
			// A name could resolve to several addresses or change; sockets
			// are bound once, so insist on an IP.
			return "", "", fmt.Errorf("listen address %q: host must be an IP address (or empty for all)", s)
		}
		return scheme, rest, nil
	case "unix":
		if !filepath.IsAbs(rest) || filepath.Clean(rest) != rest {
			return "", "", fmt.Errorf("listen address %q: unix socket path must be absolute and clean, as in unix:///run/app.sock", s)
		}
		if len(rest) > 107 {
			return "", "", fmt.Errorf("listen address %q: unix socket path is %d bytes, the limit is 107", s, len(rest))
		}
		return "unix", rest, nil
	}
	return "", "", fmt.Errorf("listen address %q: scheme %q is not tcp, tcp4, tcp6 or unix", s, scheme)
}

// Validate checks every field and says which one is wrong.
func (c *PoolConfig) Validate() error {
	if strings.TrimSpace(c.Command) == "" {
		return fmt.Errorf("command: must not be empty")
	}
	if c.Workers < 1 || c.Workers > MaxWorkers {
		return fmt.Errorf("workers: %d is out of range 1-%d", c.Workers, MaxWorkers)
	}
	for k, v := range c.Env {
		if !envKeyRE.MatchString(k) {
			return fmt.Errorf("env: %q is not a valid variable name", k)
		}
		if workerproto.IsReservedEnv(k) {
			return fmt.Errorf("env: %s is set by the supervisor and cannot be configured", k)
		}
		if strings.ContainsRune(v, 0) {
			return fmt.Errorf("env: value of %s contains a NUL byte", k)
		}
	}
	names, addrs := map[string]bool{}, map[string]bool{}
	for i, l := range c.Listen {
		if !fdNameRE.MatchString(l.Name) {
			return fmt.Errorf("listen[%d].name: %q must be 1-255 of A-Z a-z 0-9 _ . -", i, l.Name)
		}
		if names[l.Name] {
			return fmt.Errorf("listen[%d].name: %q is used twice", i, l.Name)
		}
		names[l.Name] = true
		if _, _, err := ParseListenAddr(l.Addr); err != nil {
			return fmt.Errorf("listen[%d].addr: %v", i, err)
		}
		if addrs[l.Addr] {
			return fmt.Errorf("listen[%d].addr: %q is used twice", i, l.Addr)
		}
		addrs[l.Addr] = true
	}
	nonNeg := map[string]Duration{"graceful_timeout": c.GracefulTimeout, "readiness.timeout": c.Readiness.Timeout,
		"readiness.delay": c.Readiness.Delay, "restart.initial": c.Restart.Initial, "restart.max": c.Restart.Max,
		"max_lifetime": c.MaxLifetime, "max_lifetime_jitter": c.MaxLifetimeJitter, "watchdog": c.Watchdog}
	for _, name := range []string{"graceful_timeout", "readiness.timeout", "readiness.delay", "restart.initial", "restart.max", "max_lifetime", "max_lifetime_jitter", "watchdog"} {
		if nonNeg[name] < 0 {
			return fmt.Errorf("%s: %s is negative", name, nonNeg[name].D())
		}
	}
	switch c.MapDelivery.Mode {
	case "", MapDeliverySwap:
		if c.MapDelivery.Signal != "" || c.MapDelivery.AckTimeout != 0 {
			return fmt.Errorf("map_delivery: signal and ack_timeout apply to mode %q only", MapDeliveryReload)
		}
	case MapDeliveryReload:
		if sig := c.MapDelivery.Signal; sig != "" && !slices.Contains(MapSignals, sig) {
			return fmt.Errorf("map_delivery.signal: %q is not one of %s (or empty: workers watch the map file)", sig, strings.Join(MapSignals, ", "))
		}
		if t := c.MapDelivery.AckTimeout; t < 0 || (t > 0 && t < Duration(100*time.Millisecond)) {
			return fmt.Errorf("map_delivery.ack_timeout: %s must be at least 100ms", t.D())
		}
	default:
		return fmt.Errorf("map_delivery.mode: %q is not %q or %q", c.MapDelivery.Mode, MapDeliverySwap, MapDeliveryReload)
	}
	switch c.Readiness.Mode {
	case "", ReadinessNotify, ReadinessTimer:
	default:
		return fmt.Errorf("readiness.mode: %q is not %q or %q", c.Readiness.Mode, ReadinessNotify, ReadinessTimer)
	}
	if c.Surge != nil && (*c.Surge < 1 || *c.Surge > MaxWorkers) {
		return fmt.Errorf("surge: %d is out of range 1-%d (a swap needs room for at least one new worker)", *c.Surge, MaxWorkers)
	}
	e := c.Effective()
	if e.Restart.Initial > e.Restart.Max {
		return fmt.Errorf("restart.initial: %s is larger than restart.max %s", e.Restart.Initial.D(), e.Restart.Max.D())
	}
	if c.MaxLifetimeJitter > 0 && c.MaxLifetime == 0 {
		return fmt.Errorf("max_lifetime_jitter: needs max_lifetime")
	}
	if c.MaxRequests < 0 {
		return fmt.Errorf("max_requests: %d is negative (0 turns it off)", c.MaxRequests)
	}
	if c.MaxRequestsJitter < 0 {
		return fmt.Errorf("max_requests_jitter: %d is negative", c.MaxRequestsJitter)
	}
	if c.MaxRequestsJitter > 0 && c.MaxRequests == 0 {
		return fmt.Errorf("max_requests_jitter: needs max_requests")
	}
	if c.MaxMemory < 0 || (c.MaxMemory > 0 && c.MaxMemory < MinMaxMemory) {
		return fmt.Errorf("max_memory: %s is below the minimum %s (0 or omitted turns it off)", c.MaxMemory, MinMaxMemory)
	}
	if c.Watchdog > 0 && c.Watchdog < Duration(100*time.Millisecond) {
		return fmt.Errorf("watchdog: %s is too short (at least 100ms)", c.Watchdog.D())
	}
	for name, d := range map[string]*Duration{"stability.window": c.Stability.Window, "stability.rollback_within": c.Stability.RollbackWithin} {
		if d != nil && *d < 0 {
			return fmt.Errorf("%s: %s is negative (\"0s\" turns it off)", name, d.D())
		}
	}
	if p := c.Probe; p != nil {
		if !strings.HasPrefix(p.Path, "/") || strings.ContainsAny(p.Path, " \t\r\n") {
			return fmt.Errorf("probe.path: %q must be an HTTP path starting with / and without spaces", p.Path)
		}
		if p.Interval < 0 || (p.Interval > 0 && p.Interval < Duration(100*time.Millisecond)) {
			return fmt.Errorf("probe.interval: %s must be at least 100ms", p.Interval.D())
		}
		if p.Timeout < 0 || (p.Timeout > 0 && p.Timeout < Duration(10*time.Millisecond)) {
			return fmt.Errorf("probe.timeout: %s must be at least 10ms", p.Timeout.D())
		}
		if p.Failures < 0 || p.Failures > 100 {
			return fmt.Errorf("probe.failures: %d is out of range 1-100", p.Failures)
		}
	}
	return nil
}

// Effective returns a copy with defaults filled in.
func (c PoolConfig) Effective() PoolConfig {
	def := func(d *Duration, v time.Duration) {
		if *d == 0 {
			*d = Duration(v)
		}
	}
	def(&c.GracefulTimeout, DefaultGracefulTimeout)
	if c.Readiness.Mode == "" {
		c.Readiness.Mode = ReadinessNotify
	}
	def(&c.Readiness.Timeout, DefaultReadinessTimeout)
	if c.Readiness.Mode == ReadinessTimer {
		def(&c.Readiness.Delay, DefaultReadinessDelay)
	}
	if c.MapDelivery.Mode == "" {
		c.MapDelivery.Mode = MapDeliverySwap
	}
	if c.MapDelivery.Reload() {
		def(&c.MapDelivery.AckTimeout, DefaultMapAckTimeout)
	}
	// A pointer field gets a value of its own, so that the result shares
	// nothing with the caller's config: a copy, or the default if unset.
	own := func(d **Duration, v time.Duration) {
		x := Duration(v)
		if *d != nil {
			x = **d
		}
		*d = &x
	}
	own(&c.Stability.Window, DefaultStabilityWindow)
	own(&c.Stability.RollbackWithin, DefaultRollbackWithin)
	if c.Probe != nil {
		p := *c.Probe
		def(&p.Interval, DefaultProbeInterval)
		def(&p.Timeout, DefaultProbeTimeout)
		if p.Failures == 0 {
			p.Failures = DefaultProbeFailures
		}
		c.Probe = &p
	}
	def(&c.Restart.Initial, DefaultRestartInitial)
	def(&c.Restart.Max, DefaultRestartMax)
	if c.Restart.Max < c.Restart.Initial && c.Restart.Max == Duration(DefaultRestartMax) {
		c.Restart.Max = c.Restart.Initial // only initial was given, and it is larger than the default max
	}
	if c.Surge == nil {
		s := c.Workers
		c.Surge = &s
	} else {
		s := *c.Surge
		c.Surge = &s
	}
	c.Env = cloneMap(c.Env)
	c.Args = append([]string(nil), c.Args...)
	c.Listen = append([]Listen(nil), c.Listen...)
	return c
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// DecodePoolConfig decodes and validates a pool config.
func DecodePoolConfig(znode string, data []byte) (*PoolConfig, error) {
	return decodeAs("pool config", znode, data, PoolConfigVersion, (*PoolConfig).Validate)
}

// Swap results in PoolStatus.Result.
const (
	SwapOK            = "ok"             // the generation is serving
	SwapFailed        = "failed"         // new workers did not become ready; the old generation keeps serving
	SwapInvalidConfig = "invalid_config" // the config was rejected before any worker started
	SwapInvalidMap    = "invalid_map"    // the bucket map was rejected; the last good map stays
	// SwapRolledBack: the new config's workers crashed after READY=1
	// (inside the stability window, or in a crash loop soon after); the
	// last config that held serves, and the failed one is not retried
	// until the config changes (or HUP).
	SwapRolledBack = "rolled_back"
)

// PoolStatus is the last swap result a supervisor of the pool published, at
// Paths.PoolStatus (last writer wins).
type PoolStatus struct {
	Version       int       `json:"version"`
	Member        string    `json:"member"`
	Result        string    `json:"result"`
	Generation    int64     `json:"generation"`
	ConfigVersion int64     `json:"config_version"`
	MapVersion    uint64    `json:"map_version"`
	Error         string    `json:"error,omitempty"`
	SwapSeconds   float64   `json:"swap_seconds,omitempty"`
	At            time.Time `json:"at"`
}

// DecodePoolStatus decodes a pool status record.
func DecodePoolStatus(znode string, data []byte) (*PoolStatus, error) {
	return decodeAs("pool status", znode, data, PoolStatusVersion, func(s *PoolStatus) error {
		switch s.Result {
		case SwapOK, SwapFailed, SwapInvalidConfig, SwapInvalidMap, SwapRolledBack:
			return nil
		}
		return fmt.Errorf("result %q is unknown", s.Result)
	})
}

// PoolMember is one running supervisor's ephemeral record at
// Paths.PoolMember: what it has applied and how its workers are.
type PoolMember struct {
	Version       int    `json:"version"`
	Member        string `json:"member"`
	Host          string `json:"host"`
	PID           int    `json:"pid"`
	State         string `json:"state"` // starting, serving, degraded, lost, stopping
	Accepting     bool   `json:"accepting"`
	Generation    int64  `json:"generation"`
	ConfigVersion int64  `json:"config_version"`
	// MapVersion is the lowest map version every ready worker routes by
	// (reload mode: by their MAPVERSION acknowledgements; swap mode: the
	// serving generation's map). The mover waits on it.
	MapVersion uint64 `json:"map_version"`
	// MapDelivery is the serving generation's map delivery mode.
	MapDelivery string `json:"map_delivery,omitempty"`
	// ZK is the ZooKeeper session state as this member saw it when it
	// wrote the record; FailStatic that it kept serving through a
	// whole-ensemble outage (reported once the ensemble is back).
	ZK         string       `json:"zk,omitempty"`
	FailStatic *FailStatic  `json:"fail_static,omitempty"`
	Target     int          `json:"target_workers"`
	Workers    []WorkerInfo `json:"workers"`
	LastError  string       `json:"last_error,omitempty"`
	// RolledBack is the last config this member rolled back from since it
	// started (nil: none). The config stays refused until it changes.
	RolledBack *Rollback `json:"rolled_back,omitempty"`
	Admin      string    `json:"admin,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// Rollback is a config a supervisor stopped running because its workers
// crashed after READY=1.
type Rollback struct {
	// ConfigVersion is the config that failed; ToConfigVersion the one
	// that serves instead.
	ConfigVersion   int64     `json:"config_version"`
	ToConfigVersion int64     `json:"to_config_version"`
	Reason          string    `json:"reason"`
	At              time.Time `json:"at"`
}

// WorkerInfo is one worker in a PoolMember record.
type WorkerInfo struct {
	ID         int64     `json:"id"`
	PID        int       `json:"pid"`
	Generation int64     `json:"generation"`
	State      string    `json:"state"` // starting, ready, stopping
	StartedAt  time.Time `json:"started_at"`
	// MapVersion is the map version the worker routes by, as far as the
	// supervisor knows (reload mode: its last MAPVERSION).
	MapVersion uint64 `json:"map_version,omitempty"`
}

// FailStatic describes the last time a supervisor kept serving while the
// whole ZooKeeper ensemble was unreachable (its peers agreed).
type FailStatic struct {
	Since time.Time `json:"since"`
	Until time.Time `json:"until,omitempty"` // zero while it lasts
	Peers int       `json:"peers"`           // peers that agreed
}

// DecodePoolMember decodes a member record.
func DecodePoolMember(znode string, data []byte) (*PoolMember, error) {
	return decodeAs[PoolMember]("pool member", znode, data, PoolMemberVersion, nil)
}

// EncodePoolConfig renders a config the way `shardctl pool get` prints it.
func EncodePoolConfig(c *PoolConfig) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(c); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}
