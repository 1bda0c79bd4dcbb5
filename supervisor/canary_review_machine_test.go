package supervisor

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/topo"
)

// Adversarial review of issue 24 (a broken deploy that boots): each test
// states what should hold and fails where the machine does otherwise.

func timerMode(delay time.Duration) func(*topo.PoolConfig) {
	return func(c *topo.PoolConfig) {
		c.Readiness = topo.Readiness{Mode: topo.ReadinessTimer, Delay: topo.Duration(delay)}
	}
}

// Timer mode has no READY=1: the timer is only a lower bound, and with a
// probe configured the probe's first pass was the evidence of readiness
// (up to readiness.timeout). A worker that takes longer than the timer
// to boot now gets its first probe at the timer, which times out (the
// worker does not accept yet), and is SIGKILLed as probe_first: the first
// generation of such a pool never serves, and a new config of it is
// refused after three attempts.
func TestMachineReview24TimerModeSlowBootIsNotKilledAtTheTimer(t *testing.T) {
	s := newSim(t, false)
	s.expect("first config", s.send(poolCfg(1, 1, withProbe, timerMode(2*time.Second))), "prepare g1", "start w1 g1")
	s.at(2 * time.Second)
	s.expect("the timer claims the worker", s.tick(), "probe w1")
	// Still booting: the probe socket's backlog holds the connection and
	// nothing accepts it before probe.timeout.
	s.at(3 * time.Second)
	got := s.send(evProbe{w: s.w(1), why: "context deadline exceeded (Client.Timeout exceeded while awaiting headers)", first: true})
	for _, a := range got {
		if strings.HasPrefix(a, "kill w1") || strings.HasPrefix(a, "publish failed") {
			t.Fatalf("a timer-mode worker still booting after its timer was killed at its first probe: %v", got)
		}
	}
	s.at(3500 * ms)
	s.expect("it answers: ready", s.send(evProbe{w: s.w(1), ok: true}),
		"publish ok g1", "notify READY=1 STATUS=serving generation 1", "clean-maps keep ")
}

// A failed swap that cost no traffic (the sockets could not be bound, a
// fork failed, the workers exited before READY=1 because the database is
// briefly down) is no broken deploy that boots, yet it counts towards the
// refusal: after 3 such failures (1 s + 2 s with the defaults) the config
// is refused for good on this host, and the fleet runs two versions until
// someone sends HUP. The docs' own reason for retrying with nothing
// serving ("retrying costs no traffic, and it may work once what it needs
// is back") holds here too.
func TestMachineReview24BindFailuresDoNotRefuseTheConfig(t *testing.T) {
	s := probeServing(t, 2)
	newAddr := func(c *topo.PoolConfig) { c.Listen = []topo.Listen{{Name: "http", Addr: "tcp://127.0.0.1:9999"}} }
	cfg := poolCfg(2, 2, withProbe, restart(time.Second, 8*time.Second), newAddr)
	s.failPrepare[2], s.failPrepare[3], s.failPrepare[4] = true, true, true
	s.expect("bind fails", s.swapAt(time.Second, cfg), "prepare g2", "publish failed g2")
	s.at(2250 * ms)
	s.expect("attempt 2", s.tick(), "prepare g3", "publish failed g3")
	s.at(4250 * ms)
	s.expect("attempt 3", s.tick(), "prepare g4", "publish failed g4")
	// The port is free again.
	s.at(time.Minute)
	got := s.tick()
	if len(got) == 0 || got[0] != "prepare g5" {
		t.Fatalf("a config whose swaps failed only to bind is refused for good (%q): %v", s.mc.lastError, got)
	}
}

// The serving generation's workers all crash while the canary boots
// (an OOM kill, a bad dependency of both). The canary fails its first
// probe, and nothing is ready when the retry comes: the retry starts the
// whole broken generation at once (no canary) and stops the serving
// config's respawned workers that were booting ("superseded"). Nothing
// serving, the broken config is never refused: the serving config comes
// back only once the retry backoff has grown past its boot time (never,
// if that is over restart.max), N broken workers at once each retry.
func TestMachineReview24RetryDoesNotStopTheServingConfigsRespawns(t *testing.T) {
	s := probeServing(t, 2)
	broken := poolCfg(2, 2, withProbe, restart(time.Second, 8*time.Second))
	s.expect("canary", s.swapAt(time.Second, broken), "prepare g2", "notify RELOADING=1 STATUS=swapping to generation 2", "start w3 g2")
	s.at(1300 * ms)
	s.exit(1, "signal: killed")
	s.exit(2, "signal: killed")
	s.ready(3)
	s.expect("canary fails", s.send(evProbe{w: s.w(3), why: "status 500", first: true}), "kill w3 probe_first", "publish failed g2",
		"notify READY=1 STATUS=swap to generation 2 failed; generation 1 serves")
	s.exit(3, "signal: killed")
	// The serving config respawns (crash backoff), and boots slowly.
	var respawned []int64
	for at := 1300 * ms; at <= 6*time.Second; at += 100 * ms {
		s.at(at)
		for _, a := range s.tick() {
			var id, g int64
			if n, _ := fmtSscanf(a, "start w%d g%d", &id, &g); n == 2 {
				if g == 1 {
					respawned = append(respawned, id)
				}
				if g != 1 {
					broken := 0
					for _, w := range s.mc.workers {
						if w.gen.id == g && w.state != wStopping {
							broken++
						}
					}
					if broken > 1 {
						t.Fatalf("%.1fs: %d workers of the broken config at once (no canary): %s", at.Seconds(), broken, s.workers())
					}
				}
			}
			if strings.Contains(a, "superseded") {
				t.Fatalf("%.1fs: the serving config's booting respawn was stopped by a retry of the broken one: %q (%s)", at.Seconds(), a, s.workers())
			}
		}
	}
	if len(respawned) == 0 {
		t.Fatalf("the serving config was never respawned: %s", s.workers())
	}
}

func fmtSscanf(s, format string, a ...any) (int, error) { return fmt.Sscanf(s, format, a...) }

// The other side of the timer-mode fix: a timer-mode worker that answers
// its first probe after the timer with an error is up and broken, and is
// killed as in notify mode.
func TestMachineReview24TimerModeWorkerAnsweringAFailureIsKilled(t *testing.T) {
	s := probeServing(t, 1)
	cfg := poolCfg(2, 1, withProbe, timerMode(2*time.Second), restart(time.Second, 8*time.Second))
	s.expect("canary", s.swapAt(time.Second, cfg), "prepare g2", "notify RELOADING=1 STATUS=swapping to generation 2", "start w2 g2")
	s.at(3250 * ms)
	s.expect("the timer claims it", s.tick(), "probe w2")
	s.expect("it answers 500: killed, the swap fails", s.send(evProbe{w: s.w(2), why: "status 500", first: true, answered: true}),
		"kill w2 probe_first", "publish failed g2", "notify READY=1 STATUS=swap to generation 2 failed; generation 1 serves")
}

// probeOnce tells an answer from a worker that answers nothing yet (a
// bound probe socket nobody accepts on: the connection waits in the
// backlog until probe.timeout).
func TestReview24ProbeOnceTellsAnAnswerFromSilence(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "broken", 500) }))
	defer srv.Close()
	c := &http.Client{Timeout: 100 * ms, Transport: &http.Transport{DisableKeepAlives: true}}
	if why, answered := probeOnce(context.Background(), c, srv.URL); why != "status 500" || !answered {
		t.Fatalf("a 500: %q answered=%v", why, answered)
	}
	f, addr, err := bindProbe() // listening, never accepted
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if why, answered := probeOnce(context.Background(), c, "http://"+addr+"/"); why == "" || answered {
		t.Fatalf("silence: %q answered=%v", why, answered)
	}
}

// A new config after a refusal is a first attempt: its retry comes after
// restart.initial ("retried after restart.initial, doubling"), not after
// the refused config's fourth backoff.
func TestMachineReview24NewConfigAfterARefusalStartsItsBackoffAgain(t *testing.T) {
	s := probeServing(t, 1)
	mut := []func(*topo.PoolConfig){withProbe, restart(time.Second, 30*time.Second)}
	fail := func(id int64) {
		s.t.Helper()
		s.ready(id)
		s.send(evProbe{w: s.w(id), why: "status 500", first: true, answered: true})
		s.exit(id, "signal: killed")
	}
	s.swapAt(time.Second, poolCfg(2, 1, mut...))
	fail(2)
	s.at(2250 * ms)
	s.tick()
	fail(3)
	s.at(4250 * ms)
	s.tick()
	fail(4)
	if !strings.Contains(s.mc.lastError, "refused") {
		t.Fatalf("not refused: %s", s.mc.lastError)
	}
	s.swapAt(10*time.Second, poolCfg(3, 1, mut...))
	fail(5)
	if d := s.mc.retryAt.Sub(s.now); d != time.Second {
		t.Fatalf("config 3's first failure retries after %s, want restart.initial (1s)", d)
	}
}
