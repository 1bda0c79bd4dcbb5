package supervisor

import (
	"net"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/faultproxy"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// Every supervisor's connection to ZooKeeper dropped at once (a leader
// election closes every client's), two come back at once and one stays
// out: the one left out declares its session lost, asks, and hears two
// peers connected, but both only since after its own last answer (their
// signed ages, over real HTTP, from real sessions): a disruption shared
// with them. It serves on, waiting for its own session until 5/6 of the
// session timeout after its last answer, and leaves service then since
// its own never came back. (That the session coming back within the wait
// keeps every worker is the machine's test: the library's reconnect
// pauses make its timing here a coin toss.)
func TestZooKeeperLossSharedDisruptionWaitsThenLeaves(t *testing.T) {
	skipUnderRace(t)
	testenv.Faults(t)
	// 9 s: the two peers are back (~1.5 s) well before the third counts
	// its session lost (2/3 of it after its last answer).
	tr := startTrioTimeout(t, []byte("s3cret"), 9*time.Second)
	var loads []*load
	for i := 1; i < 3; i++ {
		loads = append(loads, startLoad(tr.addrs[i], 2))
	}
	start := time.Now()
	for _, p := range tr.proxies {
		p.SetMode(faultproxy.Reset)
	}
	time.Sleep(300 * time.Millisecond) // deliberate: every session dropped before two come back
	tr.proxies[1].SetMode(faultproxy.Pass)
	tr.proxies[2].SetMode(faultproxy.Pass)

	testenv.WaitFor(t, 20*time.Second, func() bool {
		return testCounter(t, tr.hs[0], "shardvisor_supervisor_peer_checks_total", "shared") == 1
	}, "web1 to find its loss shared with its peers")
	sharedAt := time.Since(start)
	if n := testCounter(t, tr.hs[0], "shardvisor_supervisor_peer_checks_total", "cut_off"); n != 0 {
		t.Fatalf("web1 counted itself cut off (%v) before the wait", n)
	}
	if code, body := healthBody(t, tr.hs[0]); code != 200 {
		t.Fatalf("web1 /healthz during the wait: %d %v", code, body)
	}
	testenv.WaitFor(t, 20*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", tr.addrs[0], 200*time.Millisecond)
		if err == nil {
			c.Close()
			return false
		}
		return true
	}, "web1 to leave service at the wait's end")
	// Logged, not asserted (a shared machine is noisy).
	t.Logf("web1: shared disruption found %s after the drop; out of service %s after it (session timeout %s: 5/6 is %s after its last answer)",
		sharedAt.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), tr.timeout, tr.timeout*5/6)
	if n := testCounter(t, tr.hs[0], "shardvisor_supervisor_peer_checks_total", "cut_off"); n != 1 {
		t.Fatalf("peer_checks_total{verdict=cut_off} %v after the wait", n)
	}
	tr.proxies[0].SetMode(faultproxy.Pass)
	tr.hs[0].waitFor(60*time.Second, "web1 serving again", serving(0, 2))
	tr.othersUnharmed(t, loads)
}
