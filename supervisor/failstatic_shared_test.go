package supervisor

import (
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/zksession"
)

// A disruption the peers shared (CI failure: a ZooKeeper leader restarted
// during the multi-host suite's certificate rotation; every client
// dropped; web2 reconnected 1 s before web1, web1 declared its session
// lost, asked, heard "web2 is connected" and left service though its own
// session came back 100 ms later): the connected peer reconnected after
// this host's last answer, so this host serves on and waits for its own
// session.
func sharedVerdict(wait time.Duration) peerVerdict {
	return peerVerdict{known: 2, answered: 2, connected: []string{"web/b"}, ages: []time.Duration{900 * time.Millisecond}, waitOwn: wait}
}

func TestMachineSharedDisruptionSessionBackWithinTheWait(t *testing.T) {
	s := failStaticSim(t) // lost at 1 s, the peers asked
	s.expect("the peers reconnected after our last answer: serve on, nothing killed", s.send(evPeers{sharedVerdict(1500 * time.Millisecond)}))
	mem, h, _ := s.mc.snapshot()
	if !h.accepting || !h.serving || !strings.Contains(h.reason, "shared disruption") || mem.State == "lost" {
		t.Fatalf("during the wait: member %+v health %+v", mem, h)
	}
	if d := s.mc.nextWake(s.now); d > 1500*time.Millisecond {
		t.Fatalf("next wake in %s, after the wait's end (1.5 s)", d)
	}
	s.at(2 * time.Second)
	s.expect("within the wait", s.tick())
	s.expect("our session is back: serving normally, nothing restarted", s.send(evZK{zksession.StateChange{To: zksession.StateConnected}}))
	s.at(10 * time.Second)
	s.expect("long after the wait's end: nothing", s.tick())
	if s.mc.mode != modeRunning || s.mc.failStatic != nil {
		t.Fatalf("mode %s fail-static %+v", s.mc.mode, s.mc.failStatic)
	}
	if n := counterValue(s.mc.m.peerChecks.WithLabelValues("shared")); n != 1 {
		t.Fatalf("peer_checks_total{verdict=shared} %v", n)
	}
	if n := counterValue(s.mc.m.peerChecks.WithLabelValues("cut_off")); n != 0 {
		t.Fatalf("peer_checks_total{verdict=cut_off} %v", n)
	}
}

func TestMachineSharedDisruptionLeavesAtTheWaitsEnd(t *testing.T) {
	s := failStaticSim(t)
	s.expect("shared: serve on", s.send(evPeers{sharedVerdict(1500 * time.Millisecond)}))
	s.at(2499 * time.Millisecond)
	s.expect("just before the wait's end", s.tick())
	s.at(2500 * time.Millisecond)
	s.expect("our session did not come back in time: leave service",
		s.tick(), "kill w1 zk_lost", "kill w2 zk_lost", "close-sockets all", "notify STATUS=zookeeper session lost; not serving")
	if mem, h, _ := s.mc.snapshot(); mem.State != "lost" || h.accepting {
		t.Fatalf("member %+v health %+v", mem, h)
	}
	if n := counterValue(s.mc.m.peerChecks.WithLabelValues("cut_off")); n != 1 {
		t.Fatalf("peer_checks_total{verdict=cut_off} %v", n)
	}
	// Back later: the usual holddown, then serving.
	s.at(3 * time.Second)
	s.send(evZK{zksession.StateChange{To: zksession.StateConnected}})
	if s.mc.mode != modeHolddown {
		t.Fatalf("mode %s after the session came back; want holddown", s.mc.mode)
	}
}

// A wait is started once per loss: the next loss asks and decides afresh.
func TestMachineSharedDisruptionWaitIsPerLoss(t *testing.T) {
	s := failStaticSim(t)
	s.send(evPeers{sharedVerdict(time.Second)})
	s.at(1500 * time.Millisecond)
	s.send(evZK{zksession.StateChange{To: zksession.StateConnected}})
	if !s.mc.sharedUntil.IsZero() {
		t.Fatal("the wait outlived the session's return")
	}
	s.at(5 * time.Second)
	s.expect("lost again: ask the peers", s.send(evZK{zksession.StateChange{To: zksession.StateLost, Reason: "again"}}), "check-peers")
	s.expect("this time a peer was connected all along: leave at once",
		s.send(evPeers{peerVerdict{known: 2, answered: 2, connected: []string{"web/b"}, ages: []time.Duration{time.Hour}}}),
		"kill w1 zk_lost", "kill w2 zk_lost", "close-sockets all", "notify STATUS=zookeeper session lost; not serving")
}

// sharedWait: a wait only when every connected peer said, signed, that it
// reconnected after this host's last answer; never past 5/6 of the session
// timeout after that answer; never in an outage.
func TestSharedWaitRule(t *testing.T) {
	const T = 10 * time.Second
	silent := 7 * time.Second // lost at 2/3 T, plus the time to ask
	for _, tc := range []struct {
		name   string
		v      peerVerdict
		silent time.Duration
		now    time.Duration
		want   time.Duration
	}{
		{"one peer, reconnected 1 s ago", peerVerdict{known: 1, answered: 1, connected: []string{"a"}, ages: []time.Duration{time.Second}}, silent, silent, T*5/6 - silent},
		{"the wait counts from our silence now", peerVerdict{known: 1, answered: 1, connected: []string{"a"}, ages: []time.Duration{time.Second}}, silent, silent + 500*time.Millisecond, T*5/6 - silent - 500*time.Millisecond},
		{"a peer connected all along", peerVerdict{known: 2, answered: 2, connected: []string{"a", "b"}, ages: []time.Duration{time.Second, time.Hour}}, silent, silent, 0},
		{"a peer connected just before our last answer", peerVerdict{known: 1, answered: 1, connected: []string{"a"}, ages: []time.Duration{silent}}, silent, silent, 0},
		{"a connected peer without an age (older, or unsigned)", peerVerdict{known: 2, answered: 2, connected: []string{"a", "b"}, ages: []time.Duration{time.Second}}, silent, silent, 0},
		{"no peer connected (too few answers)", peerVerdict{known: 3, answered: 1}, silent, silent, 0},
		{"an outage: fail-static decides", peerVerdict{known: 2, answered: 2}, silent, silent, 0},
		{"past 5/6 of the timeout already", peerVerdict{known: 1, answered: 1, connected: []string{"a"}, ages: []time.Duration{time.Second}}, 9 * time.Second, 9 * time.Second, 0},
	} {
		if got := sharedWait(tc.v, tc.silent, tc.now, T); got != tc.want {
			t.Errorf("%s: wait %s, want %s", tc.name, got, tc.want)
		}
	}
}
