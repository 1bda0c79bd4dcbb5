package topo

import (
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testkit"
)

func TestPoolConfigDecode(t *testing.T) {
	good := `{"version":1,"command":"/usr/bin/app","args":["-v"],"env":{"A":"1"},"workers":4,
	  "listen":[{"name":"http","addr":"tcp://127.0.0.1:8080"},{"name":"admin","addr":"unix:///run/app.sock"}],
	  "graceful_timeout":"10s","readiness":{"mode":"notify","timeout":"20s"},"surge":2,
	  "restart":{"initial":"500ms","max":"10s"},"max_lifetime":"1h","max_lifetime_jitter":"5m","watchdog":"3s"}`
	c, err := DecodePoolConfig("/p/config", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if c.Workers != 4 || *c.Surge != 2 || c.GracefulTimeout.D() != 10*time.Second || c.Listen[1].Addr != "unix:///run/app.sock" || c.Watchdog.D() != 3*time.Second {
		t.Fatalf("decoded %+v", c)
	}
	b, err := EncodePoolConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := DecodePoolConfig("", b)
	if err != nil {
		t.Fatalf("round trip of %s: %v", b, err)
	}
	if c2.MaxLifetimeJitter != c.MaxLifetimeJitter || c2.Readiness != c.Readiness {
		t.Fatalf("round trip changed %+v -> %+v", c, c2)
	}

	min := `{"version":1,"command":"app","workers":2}`
	c, err = DecodePoolConfig("", []byte(min))
	if err != nil {
		t.Fatal(err)
	}
	e := c.Effective()
	if e.GracefulTimeout.D() != DefaultGracefulTimeout || e.Readiness.Mode != ReadinessNotify || *e.Surge != 2 ||
		e.Restart.Initial.D() != DefaultRestartInitial || e.Readiness.Timeout.D() != DefaultReadinessTimeout {
		t.Fatalf("defaults %+v", e)
	}
	if c.Surge != nil {
		t.Fatal("Effective modified its receiver")
	}
	timer, _ := DecodePoolConfig("", []byte(`{"version":1,"command":"app","workers":1,"readiness":{"mode":"timer"}}`))
	if timer.Effective().Readiness.Delay.D() != DefaultReadinessDelay {
		t.Fatalf("timer default delay %v", timer.Effective().Readiness)
	}

	reload, err := DecodePoolConfig("", []byte(`{"version":1,"command":"app","workers":1,"map_delivery":{"mode":"reload","signal":"SIGUSR2"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if e := reload.Effective(); !e.MapDelivery.Reload() || e.MapDelivery.Signal != "SIGUSR2" || e.MapDelivery.AckTimeout.D() != DefaultMapAckTimeout {
		t.Fatalf("reload defaults %+v", e.MapDelivery)
	}
	if e := c.Effective(); e.MapDelivery.Mode != MapDeliverySwap || e.MapDelivery.Reload() {
		t.Fatalf("default map delivery %+v", e.MapDelivery)
	}

	testkit.WantMalformed(t, ErrMalformed, "DecodePoolConfig", DecodePoolConfig, "pool config", "/x/pools/web/config", []testkit.Malformed{
		{`{"version":1,"command":"app","workers":1,"map_delivery":{"mode":"push"}}`, `map_delivery.mode: "push"`},
		{`{"version":1,"command":"app","workers":1,"map_delivery":{"mode":"reload","signal":"SIGTERM"}}`, `map_delivery.signal: "SIGTERM" is not one of`},
		{`{"version":1,"command":"app","workers":1,"map_delivery":{"mode":"reload","ack_timeout":"1ms"}}`, `map_delivery.ack_timeout: 1ms must be at least 100ms`},
		{`{"version":1,"command":"app","workers":1,"map_delivery":{"signal":"SIGHUP"}}`, `apply to mode "reload" only`},
		{`{"version":1,"command":"app","workers":1,"extra":1}`, `unknown field "extra"`},
		{`{"version":1,"command":"app","workers":1,"readiness":{"mode":"notify","tiemout":"1s"}}`, `unknown field "tiemout"`},
		{`{"version":2,"command":"app","workers":1}`, "format version 2"},
		{`{"version":1,"command":"","workers":1}`, "command: must not be empty"},
		{`{"version":1,"command":"app","workers":0}`, "workers: 0 is out of range"},
		{`{"version":1,"command":"app","workers":5000}`, "workers: 5000"},
		{`{"version":1,"command":"app","workers":1,"graceful_timeout":30}`, `duration must be a string`},
		{`{"version":1,"command":"app","workers":1,"graceful_timeout":"30"}`, `missing unit`},
		{`{"version":1,"command":"app","workers":1,"graceful_timeout":"-1s"}`, `graceful_timeout: -1s is negative`},
		{`{"version":1,"command":"app","workers":1,"listen":[{"name":"a","addr":"127.0.0.1:80"}]}`, `listen[0].addr`},
		{`{"version":1,"command":"app","workers":1,"listen":[{"name":"a","addr":"udp://127.0.0.1:80"}]}`, `scheme "udp"`},
		{`{"version":1,"command":"app","workers":1,"listen":[{"name":"a","addr":"tcp://example.com:80"}]}`, `must be an IP`},
		{`{"version":1,"command":"app","workers":1,"listen":[{"name":"a","addr":"unix://rel.sock"}]}`, `absolute`},
		{`{"version":1,"command":"app","workers":1,"listen":[{"name":"a:b","addr":"tcp://:80"}]}`, `listen[0].name`},
		{`{"version":1,"command":"app","workers":1,"listen":[{"name":"a","addr":"tcp://:80"},{"name":"a","addr":"tcp://:81"}]}`, `listen[1].name: "a" is used twice`},
		{`{"version":1,"command":"app","workers":1,"listen":[{"name":"a","addr":"tcp://:80"},{"name":"b","addr":"tcp://:80"}]}`, `listen[1].addr`},
		{`{"version":1,"command":"app","workers":1,"readiness":{"mode":"magic"}}`, `readiness.mode: "magic"`},
		{`{"version":1,"command":"app","workers":1,"readiness":{"delay":"-1s"}}`, `readiness.delay: -1s is negative`},
		{`{"version":1,"command":"app","workers":1,"surge":0}`, `surge: 0 is out of range`},
		{`{"version":1,"command":"app","workers":1,"restart":{"initial":"1m","max":"10s"}}`, `restart.initial: 1m0s is larger`},
		{`{"version":1,"command":"app","workers":1,"max_lifetime_jitter":"1s"}`, `needs max_lifetime`},
		{`{"version":1,"command":"app","workers":1,"env":{"LISTEN_FDS":"1"}}`, `env: LISTEN_FDS is set by the supervisor`},
		{`{"version":1,"command":"app","workers":1,"env":{"A=B":"1"}}`, `env: "A=B"`},
		{`{"version":1,"command":"app","workers":1,"watchdog":"1ms"}`, `watchdog: 1ms is too short`},
		{`{"version":1,"command":"app","workers":1,"max_requests":-1}`, `max_requests: -1 is negative`},
		{`{"version":1,"command":"app","workers":1,"max_requests":"1000"}`, `max_requests`},
		{`{"version":1,"command":"app","workers":1,"max_requests":1.5}`, `max_requests`},
		{`{"version":1,"command":"app","workers":1,"max_requests":10,"max_requests_jitter":-2}`, `max_requests_jitter: -2 is negative`},
		{`{"version":1,"command":"app","workers":1,"max_requests_jitter":5}`, `max_requests_jitter: needs max_requests`},
		{`{"version":1,"command":"app","workers":1,"max_memory":536870912}`, `size must be a string with a unit`},
		{`{"version":1,"command":"app","workers":1,"max_memory":"512"}`, `needs a unit`},
		{`{"version":1,"command":"app","workers":1,"max_memory":"512M"}`, `needs a unit`},
		{`{"version":1,"command":"app","workers":1,"max_memory":"1.5GiB"}`, `not a whole number of GiB`},
		{`{"version":1,"command":"app","workers":1,"max_memory":"-1MiB"}`, `not a whole number`},
		{`{"version":1,"command":"app","workers":1,"max_memory":"99999999999TiB"}`, `too large`},
		{`{"version":1,"command":"app","workers":1,"max_memory":"1MiB"}`, `max_memory: 1MiB is below the minimum 16MiB`},
		{`{"version":1,"command":"app","workers":1,"max_memry":"1GiB"}`, `unknown field "max_memry"`},
	})
}

// The recycling knobs of issue 24: max_requests (+ jitter) and
// max_memory, a size with a unit that round-trips.
func TestPoolConfigRecyclingKnobs(t *testing.T) {
	c, err := DecodePoolConfig("", []byte(`{"version":1,"command":"app","workers":1,"max_requests":1000,"max_requests_jitter":50,"max_memory":"512MiB"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxRequests != 1000 || c.MaxRequestsJitter != 50 || c.MaxMemory != 512<<20 {
		t.Fatalf("decoded %+v", c)
	}
	if e := c.Effective(); e.MaxRequests != 1000 || e.MaxRequestsJitter != 50 || e.MaxMemory != 512<<20 {
		t.Fatalf("Effective changed them: %+v", e)
	}
	b, err := EncodePoolConfig(c)
	if err != nil || !strings.Contains(string(b), `"512MiB"`) {
		t.Fatalf("encoded %s %v", b, err)
	}
	if c2, err := DecodePoolConfig("", b); err != nil || c2.MaxMemory != c.MaxMemory || c2.MaxRequests != c.MaxRequests {
		t.Fatalf("round trip %+v %v", c2, err)
	}
	if off, _ := DecodePoolConfig("", []byte(`{"version":1,"command":"app","workers":1}`)); off.Effective().MaxRequests != 0 || off.Effective().MaxMemory != 0 {
		t.Fatalf("default is not off: %+v", off.Effective())
	}
	for in, want := range map[string]ByteSize{"16MiB": 16 << 20, "2GiB": 2 << 30, "1TiB": 1 << 40, "500MB": 500e6, "3kB": 3000, "3KB": 3000,
		"4KiB": 4096, "1000B": 1000, " 7 MiB ": 7 << 20, "1GB": 1e9} {
		if got, err := ParseByteSize(in); err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %d %v, want %d", in, got, err, want)
		}
	}
	for b, want := range map[ByteSize]string{0: "0B", 1000: "1000B", 4096: "4KiB", 3 << 20: "3MiB", 1 << 30: "1GiB", 1<<20 + 1: "1048577B"} {
		if b.String() != want {
			t.Errorf("ByteSize(%d) = %s, want %s", int64(b), b, want)
		}
	}
}

func TestParseListenAddr(t *testing.T) {
	for in, want := range map[string][2]string{
		"tcp://127.0.0.1:8080":   {"tcp", "127.0.0.1:8080"},
		"tcp://:0":               {"tcp", ":0"},
		"tcp6://[::1]:80":        {"tcp6", "[::1]:80"},
		"unix:///run/a/app.sock": {"unix", "/run/a/app.sock"},
	} {
		n, a, err := ParseListenAddr(in)
		if err != nil || n != want[0] || a != want[1] {
			t.Errorf("ParseListenAddr(%q) = %q %q %v", in, n, a, err)
		}
	}
}

func TestPoolStatusAndMemberDecode(t *testing.T) {
	st := PoolStatus{Version: PoolStatusVersion, Member: "h-1", Result: SwapOK, Generation: 3, ConfigVersion: 2, MapVersion: 7, At: time.Unix(1700000000, 0).UTC()}
	b, _ := Encode(st)
	got, err := DecodePoolStatus("/s", b)
	if err != nil || *got != st {
		t.Fatalf("status round trip %+v %v", got, err)
	}
	if _, err := DecodePoolStatus("/s", []byte(`{"version":1,"result":"meh"}`)); err == nil || !strings.Contains(err.Error(), `result "meh"`) {
		t.Fatalf("bad result accepted: %v", err)
	}
	m := PoolMember{Version: PoolMemberVersion, Member: "h-1", Host: "h", PID: 9, State: "serving", Workers: []WorkerInfo{{ID: 1, PID: 10, Generation: 3, State: "ready"}}}
	b, _ = Encode(m)
	gm, err := DecodePoolMember("/m", b)
	if err != nil || gm.Workers[0].PID != 10 {
		t.Fatalf("member round trip %+v %v", gm, err)
	}
	if _, err := DecodePoolMember("/m", []byte(`{"version":1,"bogus":true}`)); err == nil {
		t.Fatal("unknown member field accepted")
	}
}
