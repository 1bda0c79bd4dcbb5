package supervisor

import (
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
)

func requests(s *sim, id int64, n uint64) []string {
	return s.send(evNotify{s.w(id), workerproto.Message{Requests: n}})
}

// A worker whose reported request count reaches max_requests (plus its
// jitter) is replaced through the zero-drop path: its replacement starts
// within the surge, and it drains once that one is ready.
func TestMachineMaxRequestsRecycles(t *testing.T) {
	s := newSim(t, false)
	s.serving(2, surge(1), func(c *topo.PoolConfig) { c.MaxRequests = 100 })
	s.at(time.Second)
	s.expect("below the limit", requests(s, 1, 99))
	s.expect("at the limit: a replacement starts", requests(s, 1, 100), "start w3 g1")
	if w := s.w(1); !w.retiring || w.retireWhy != "max_requests" || w.state != wReady {
		t.Fatalf("w1: retiring %v (%s), %s; want retiring for max_requests, still ready", w.retiring, w.retireWhy, w.state)
	}
	s.expect("more reports change nothing", requests(s, 1, 150))
	s.expect("the replacement is ready: the old one drains", s.ready(3), "term w1 max_requests")
	s.expect("the other worker has its own count", requests(s, 2, 99))
	if n := counter(t, s, "shardvisor_supervisor_worker_stops_total", "max_requests"); n != 1 {
		t.Fatalf("stops{max_requests} = %v", n)
	}
}

// The jitter is drawn once per worker, in [0, max_requests_jitter].
func TestMachineMaxRequestsJitter(t *testing.T) {
	for _, tc := range []struct {
		draw  int64
		limit uint64
	}{{0, 100}, {10, 110}} {
		s := newSim(t, false)
		var asked []int64
		s.mc.randN = func(n int64) int64 { asked = append(asked, n); return tc.draw }
		s.serving(1, func(c *topo.PoolConfig) { c.MaxRequests, c.MaxRequestsJitter = 100, 10 })
		s.expect("first report", requests(s, 1, 1))
		s.expect("second report", requests(s, 1, 2))
		if w := s.w(1); w.requestLimit != tc.limit || len(asked) != 1 || asked[0] != 11 {
			t.Fatalf("draw %d: limit %d, randN asked %v; want %d, asked once for 11", tc.draw, w.requestLimit, asked, tc.limit)
		}
		s.expect("below its own limit", requests(s, 1, tc.limit-1))
		s.expect("at its own limit", requests(s, 1, tc.limit), "start w2 g1")
	}
}

// No max_requests: counts are recorded, nothing is recycled; a starting
// worker is not retired before it is ready.
func TestMachineRequestsWithoutLimit(t *testing.T) {
	s := newSim(t, false)
	s.serving(1)
	s.expect("no limit", requests(s, 1, 1<<40))
	if s.w(1).retiring || s.w(1).requests != 1<<40 {
		t.Fatalf("w1: %+v", s.w(1))
	}
	s2 := newSim(t, false)
	s2.expect("first config", s2.send(poolCfg(1, 1, func(c *topo.PoolConfig) { c.MaxRequests = 5 })), "prepare g1", "start w1 g1")
	s2.expect("starting, over the limit", requests(s2, 1, 9))
	if s2.w(1).retiring {
		t.Fatal("a starting worker was retired")
	}
}

// A worker whose tree's memory exceeds max_memory is replaced like
// max_lifetime; a measurement at or under the limit, of a starting
// worker, or of a pool without the limit changes nothing.
func TestMachineMaxMemoryRecycles(t *testing.T) {
	s := newSim(t, false)
	s.serving(2, surge(1), func(c *topo.PoolConfig) { c.MaxMemory = 64 << 20 })
	s.at(time.Second)
	s.expect("at the limit", s.send(evMemory{w: s.w(1), rss: 64 << 20}))
	s.expect("over it: a replacement starts", s.send(evMemory{w: s.w(1), rss: 64<<20 + 1}), "start w3 g1")
	if w := s.w(1); !w.retiring || w.retireWhy != "max_memory" {
		t.Fatalf("w1: retiring %v (%s)", w.retiring, w.retireWhy)
	}
	s.expect("the starting replacement is over it too: left alone", s.send(evMemory{w: s.w(3), rss: 1 << 30}))
	s.expect("replacement ready: the old one drains", s.ready(3), "term w1 max_memory")
	gone := &worker{id: 99, gen: s.w(2).gen}
	s.expect("a gone worker", s.send(evMemory{w: gone, rss: 1 << 30}))
	if n := counter(t, s, "shardvisor_supervisor_worker_stops_total", "max_memory"); n != 1 {
		t.Fatalf("stops{max_memory} = %v", n)
	}

	off := newSim(t, false)
	off.serving(1)
	off.expect("no limit", off.send(evMemory{w: off.w(1), rss: 1 << 40}))
}
