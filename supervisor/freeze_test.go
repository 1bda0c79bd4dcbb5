package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/zksession"
)

// A ZooKeeper server SIGSTOPped for 30 s, the leader or a follower, with
// three supervisors under load, each on the devenv ensemble with the
// default session timeout (10 s) and one of them on the frozen server:
// the sessions move (or wait out the election) without counting as lost,
// so no request fails, no worker is killed, no /healthz leaves 200 and
// nobody goes fail-static or asks the peers.
func TestFaultsFrozenServerZooKeeperLoss(t *testing.T) {
	testenv.Faults(t)
	skipUnderRace(t)
	testenv.Exclusive(t)
	e := startZK(t)
	if err := e.z.StartAll(); err != nil { // an older zoo.cfg is brought up to date
		t.Fatal(err)
	}
	for _, which := range []string{"leader", "follower"} {
		t.Run(which, func(t *testing.T) { frozenServer(t, e, which) })
	}
}

// sessionLog records a session's state changes: the longest time it was
// not connected, and whether it was ever lost.
type sessionLog struct {
	mu       sync.Mutex
	downAt   time.Time
	longest  time.Duration
	lost     bool
	changes  []string
	moveFrom string
}

func watchSession(s *zksession.Session) *sessionLog {
	l := &sessionLog{}
	sub := s.Subscribe()
	go func() {
		for ch := range sub.C {
			l.mu.Lock()
			l.changes = append(l.changes, fmt.Sprintf("%s->%s (%s)", ch.From, ch.To, ch.Reason))
			switch {
			case ch.To == zksession.StateConnected && !l.downAt.IsZero():
				l.longest = max(l.longest, ch.At.Sub(l.downAt))
				l.downAt = time.Time{}
			case ch.To != zksession.StateConnected && l.downAt.IsZero():
				l.downAt = ch.At
			}
			if ch.To == zksession.StateLost {
				l.lost = true
			}
			l.mu.Unlock()
		}
	}()
	return l
}

// firstOn opens a session (default timeout) whose first connection goes
// to server first: the dial hook refuses the others until it has dialed
// it once.
func firstOn(t *testing.T, connect, first string) *zksession.Session {
	var tried atomic.Bool
	dial := func(network, addr string, d time.Duration) (net.Conn, error) {
		if addr != first && !tried.Load() {
			return nil, errors.New("test: the first connection goes to " + first)
		}
		tried.Store(true)
		return net.DialTimeout(network, addr, d)
	}
	return zktest.Session(t, zksession.Config{Connect: connect, SessionTimeout: zksession.DefaultSessionTimeout, OpTimeout: 2 * time.Second, Dial: dial})
}

func frozenServer(t *testing.T, e *zkEnv, which string) {
	z := e.z
	var target int
	var err error
	if which == "leader" {
		target, err = z.Leader()
	} else {
		target, err = z.Follower()
	}
	if err != nil {
		t.Fatal(err)
	}
	// Supervisor 1 on the server to freeze, the others on the other two.
	order := []int{target}
	for i := range z.Servers {
		if i != target {
			order = append(order, i)
		}
	}
	var hs []*harness
	var addrs []string
	var logs []*sessionLog
	var sessions []*zksession.Session
	for i := range 3 {
		pool := fmt.Sprintf("frz%s%d", which[:1], i+1)
		port := testenv.FreePort(t)
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", port))
		e.put(t, e.paths.PoolConfig(pool), encode(t, cfgFor(t, port, 2, map[string]string{"TW_TAG": pool})))
		ss := firstOn(t, z.ConnectString+z.Root, z.Servers[order[i]])
		if got := ss.Server(); got != z.Servers[order[i]] {
			t.Fatalf("supervisor %d's session on %s, want %s", i+1, got, z.Servers[order[i]])
		}
		sessions = append(sessions, ss)
		opts := Options{Session: ss, Paths: e.paths, Member: "m1", Pool: pool,
			Holddown: 500 * time.Millisecond, PeerRefresh: 300 * time.Millisecond, PeerSecret: []byte("s3cret")}
		hs = append(hs, run(t, opts))
	}
	for i, h := range hs {
		h.waitFor(30*time.Second, fmt.Sprintf("supervisor %d serving", i+1), serving(0, 2))
		testenv.WaitFor(t, 20*time.Second, func() bool { return len(h.sv.peers.get()) == 2 }, "each supervisor to know its 2 peers")
	}
	var loads []*load
	for i := range hs {
		logs = append(logs, watchSession(sessions[i]))
		loads = append(loads, startLoad(addrs[i], 2))
	}
	// /healthz of every supervisor, every 100 ms, through the freeze and
	// a while after it.
	var unhealthy atomic.Int64
	var probes atomic.Int64
	var badMu sync.Mutex
	var bad []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				code, body := healthBody(t, h)
				probes.Add(1)
				if code != 200 {
					unhealthy.Add(1)
					badMu.Lock()
					if len(bad) < 5 {
						bad = append(bad, fmt.Sprintf("supervisor %d: %d %v", i+1, code, body))
					}
					badMu.Unlock()
				}
			}
		}()
	}

	t.Logf("freezing zk%d (%s) for 30 s; supervisor 1's session is on it", target+1, which)
	z.Freeze(t, target)
	time.Sleep(30 * time.Second) // deliberate: the fault lasts this long
	if err := z.Thaw(target); err != nil {
		t.Fatal(err)
	}
	// The continued server rejoins; nothing may change for the worse then
	// either.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := z.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()

	var requests, failed int64
	for i, h := range hs {
		l := loads[i]
		requests += l.ok.Load() + l.failed.Load()
		failed += l.failed.Load()
		l.finish(t)
		kills := testCounter(t, h, "shardvisor_supervisor_worker_kills_total", "")
		checks := testCounter(t, h, "shardvisor_supervisor_peer_checks_total", "")
		st := h.sv.Status()
		lg := logs[i]
		lg.mu.Lock()
		t.Logf("supervisor %d (first on zk%d): longest disconnect %s, servers abandoned %d, kills %v, peer checks %v, state %s, changes %v",
			i+1, order[i]+1, lg.longest.Round(time.Millisecond), sessions[i].ServersAbandoned(), kills, checks, st.State, lg.changes)
		lost := lg.lost
		lg.mu.Unlock()
		if lost {
			t.Errorf("supervisor %d's session counted as lost", i+1)
		}
		if kills != 0 || checks != 0 || st.FailStatic != nil {
			t.Errorf("supervisor %d: %v workers killed, %v peer checks, fail-static %+v", i+1, kills, checks, st.FailStatic)
		}
		if st.State != "serving" {
			t.Errorf("supervisor %d %s after the freeze", i+1, st.State)
		}
	}
	t.Logf("frozen %s: %d requests, %d failed; %d /healthz probes, %d not 200", which, requests, failed, probes.Load(), unhealthy.Load())
	if unhealthy.Load() != 0 {
		t.Errorf("/healthz left 200 %d times, e.g. %s", unhealthy.Load(), strings.Join(bad, "; "))
	}
	if on := sessions[0].Server(); on == z.Servers[target] {
		t.Errorf("supervisor 1's session still on the frozen server %s", on)
	}
}
