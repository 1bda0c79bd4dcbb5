package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/topo"
)

const poolName = "fleet"

// sup is one supervisor of the fleet.
type sup struct {
	i     int
	name  string // member name, sv-NN
	admin string // its admin address, 127.0.0.1:PORT
	p     *proc
	// dial reaches its sockets: from here, or from inside the isolated
	// host's namespace.
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	hc       *http.Client
	isolated bool
}

func (s *sup) get(path string, timeout time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.admin+path, nil)
	res, err := s.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

// healthy: /healthz answers 200 (the supervisor's sockets are open).
func (s *sup) healthy(timeout time.Duration) bool {
	code, _, err := s.get("/healthz", timeout)
	return err == nil && code == http.StatusOK
}

// servicePort is the port the supervisor bound for its workers (the
// pool's 127.0.0.1:0), 0 if it has none now.
func (s *sup) servicePort() int {
	_, adminPort := hostPort(s.admin)
	for _, p := range listenPorts(s.p.pid()) {
		if p != adminPort {
			return p
		}
	}
	return 0
}

// metrics reads the counters this benchmark adds up across the fleet.
type metrics struct {
	spawns, kills float64
	killsBy       map[string]float64
}

func (s *sup) metrics(timeout time.Duration) (metrics, error) {
	m := metrics{killsBy: map[string]float64{}}
	code, body, err := s.get("/metrics", timeout)
	if err != nil {
		return m, err
	}
	if code != http.StatusOK {
		return m, fmt.Errorf("%s /metrics: status %d", s.name, code)
	}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, val, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		x, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch {
		case name == "shardvisor_supervisor_worker_spawns_total":
			m.spawns = x
		case strings.HasPrefix(name, "shardvisor_supervisor_worker_kills_total"):
			m.kills += x
			if _, l, ok := strings.Cut(name, `reason="`); ok {
				m.killsBy[strings.TrimSuffix(l, `"}`)] += x
			}
		}
	}
	return m, sc.Err()
}

// fleet is one cluster with its supervisors and routers.
type fleet struct {
	b       *bench
	name    string
	mode    string
	boot    time.Duration
	c       *cluster
	sups    []*sup
	routers []*proc
	ns      *netns
	iso     *isolation
	isoIdx  int // -1: no isolated host
}

func adminAddr(i int) string  { return "127.0.0.1:" + strconv.Itoa(*adminPortBase+i) }
func routerAddr(i int) string { return "127.0.0.1:" + strconv.Itoa(*routerPortBase+i) }

// startFleet creates the cluster and starts the routers and supervisors;
// with isolate, supervisor 0 runs in a network namespace of its own.
func (b *bench) startFleet(ctx context.Context, name, mode string, boot time.Duration, isolate bool) (*fleet, error) {
	t0 := time.Now()
	f := &fleet{b: b, name: name, mode: mode, boot: boot, isoIdx: -1}
	var err error
	if f.c, err = b.newCluster(ctx, name); err != nil {
		return nil, err
	}
	if _, _, err := topo.SetPoolConfig(ctx, b.sess, f.c.paths, poolName, b.poolConfig(mode, boot), -1); err != nil {
		return nil, err
	}
	b.fleet = f
	zkArgs := []string{"--zk", b.env.zkConnect(), "--zk-root", b.root, "--cluster", name,
		"--zk-session-timeout", sessionTimeout.String(), "--log-format", "json"}
	// The fleet's shared secret for the fail-static peer answers.
	secret := filepath.Join(b.runDir, "peer-secret")
	if err := os.WriteFile(secret, []byte(benchkit.IdempotencyKey()+"\n"), 0o600); err != nil {
		return nil, err
	}
	if isolate {
		if f.ns, err = newNetns(b.ps); err != nil {
			return f, err
		}
		var peers []string
		for i := 1; i < *supervisors; i++ {
			peers = append(peers, adminAddr(i))
		}
		if f.iso, err = newIsolation(f.ns, b.env.zkAddrs, b.env.pgAddrs, peers, adminAddr(0)); err != nil {
			return f, err
		}
		f.isoIdx = 0
	}
	for i := range *routers {
		argv := append([]string{filepath.Join(b.binDir, "router"), "--listen", routerAddr(i), "--id", fmt.Sprintf("rt-%02d", i)}, zkArgs...)
		p, err := b.ps.start(fmt.Sprintf("rt-%02d.%s", i, name), argv, childEnv())
		if err != nil {
			return f, err
		}
		f.routers = append(f.routers, p)
	}
	var hostDial net.Dialer
	for i := range *supervisors {
		s := &sup{i: i, name: fmt.Sprintf("sv-%02d", i), admin: adminAddr(i), dial: hostDial.DialContext}
		argv := append([]string{filepath.Join(b.binDir, "supervisor"), "--pool", poolName, "--member", s.name, "--admin", s.admin,
			"--state-dir", filepath.Join(b.runDir, name, s.name), "--peer-secret-file", secret}, zkArgs...)
		if i == f.isoIdx {
			s.isolated = true
			s.dial = f.ns.dial
			argv = append(f.ns.nsenter(), argv...)
		}
		s.hc = &http.Client{Transport: &http.Transport{DialContext: s.dial, MaxIdleConnsPerHost: 2}}
		if s.p, err = b.ps.start(fmt.Sprintf("sv-%02d.%s", i, name), argv, childEnv()); err != nil {
			return f, err
		}
		f.sups = append(f.sups, s)
		// Half a second per ten: 2 cores booting a hundred workers at once
		// would make the first readiness figures meaningless.
		if i%10 == 9 {
			time.Sleep(500 * time.Millisecond)
		}
	}
	m, _, err := f.c.st.Load(ctx)
	if err != nil {
		return f, err
	}
	if _, err := f.settle(ctx, m.Version, 3*time.Minute+3*boot, nil); err != nil {
		return f, err
	}
	say("fleet %s: %d supervisors (map delivery %s%s), %d routers, cluster %s, up in %.1f s", name, len(f.sups), mode,
		map[bool]string{true: fmt.Sprintf(", %s boot", boot), false: ""}[boot > 0], len(f.routers), name, time.Since(t0).Seconds())
	return f, nil
}

// stop ends the fleet's processes and proxies (the cluster's database and
// ZooKeeper tree go at exit).
func (f *fleet) stop() {
	var ps []*proc
	for _, s := range f.sups {
		ps = append(ps, s.p)
	}
	f.b.ps.stop(ps, syscall.SIGQUIT, 15*time.Second)
	f.b.ps.stop(f.routers, syscall.SIGTERM, 10*time.Second)
	if f.iso != nil {
		f.iso.close()
	}
	if f.ns != nil {
		f.b.ps.stop([]*proc{f.ns.holder}, syscall.SIGKILL, 5*time.Second)
		f.ns.close()
	}
}

// fleetState is what the member records say.
type fleetState struct {
	serving, routers int // at map version >= want
	lagging          []string
}

// state reads every member record: supervisors serving and accepting at
// map version >= want, routers at >= want.
func (f *fleet) state(ctx context.Context, want uint64, skip map[string]bool) (fleetState, error) {
	var st fleetState
	members, err := topo.ListPoolMembers(ctx, f.b.sess, f.c.paths, poolName)
	if err != nil {
		return st, err
	}
	seen := map[string]bool{}
	for _, e := range members {
		if e.Err != nil || skip[e.Rec.Member] {
			continue
		}
		seen[e.Rec.Member] = true
		if e.Rec.State == "serving" && e.Rec.Accepting && e.Rec.MapVersion >= want {
			st.serving++
		} else {
			st.lagging = append(st.lagging, fmt.Sprintf("%s (%s, map %d)", e.Rec.Member, e.Rec.State, e.Rec.MapVersion))
		}
	}
	for _, s := range f.sups {
		if !seen[s.name] && !skip[s.name] {
			st.lagging = append(st.lagging, s.name+" (no record)")
		}
	}
	rs, err := topo.ListRouters(ctx, f.b.sess, f.c.paths)
	if err != nil {
		return st, err
	}
	for _, e := range rs {
		if e.Err == nil && e.Rec.MapVersion >= want {
			st.routers++
		}
	}
	return st, nil
}

// settle waits until every supervisor (but those in skip) serves map
// version want, and every router has it; it returns how long that took.
func (f *fleet) settle(ctx context.Context, want uint64, timeout time.Duration, skip map[string]bool) (time.Duration, error) {
	t0 := time.Now()
	deadline := t0.Add(timeout)
	wantSups := len(f.sups) - len(skip)
	var last fleetState
	for {
		st, err := f.state(ctx, want, skip)
		if err == nil {
			last = st
			if st.serving == wantSups && st.routers == len(f.routers) {
				return time.Since(t0), nil
			}
		}
		if time.Now().After(deadline) {
			return time.Since(t0), fmt.Errorf("fleet %s not settled at map version %d after %s: %d/%d supervisors serving, %d/%d routers (%v; lagging: %s)",
				f.name, want, timeout, last.serving, wantSups, last.routers, len(f.routers), err, first(last.lagging, 8))
		}
		select {
		case <-ctx.Done():
			return time.Since(t0), ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func first(xs []string, n int) string {
	if len(xs) > n {
		return strings.Join(xs[:n], ", ") + fmt.Sprintf(" and %d more", len(xs)-n)
	}
	return strings.Join(xs, ", ")
}

// scrape adds up the counters of every supervisor (but skip) in parallel.
func (f *fleet) scrape(skip map[string]bool) (metrics, []string) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	total := metrics{killsBy: map[string]float64{}}
	var errs []string
	for _, s := range f.sups {
		if skip[s.name] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := s.metrics(5 * time.Second)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", s.name, err))
				return
			}
			total.spawns += m.spawns
			total.kills += m.kills
			for k, v := range m.killsBy {
				total.killsBy[k] += v
			}
		}()
	}
	wg.Wait()
	return total, errs
}

func (m metrics) minus(o metrics) metrics {
	d := metrics{spawns: m.spawns - o.spawns, kills: m.kills - o.kills, killsBy: map[string]float64{}}
	for k, v := range m.killsBy {
		if x := v - o.killsBy[k]; x != 0 {
			d.killsBy[k] = x
		}
	}
	return d
}

// sample is the supervisors the load goes to: --load-sample of them,
// spread over the fleet, the isolated one (index 0) among them.
func (f *fleet) sample(exclude map[string]bool) []*sup {
	n := min(*loadSample, len(f.sups))
	var out []*sup
	for k := range n {
		s := f.sups[k*len(f.sups)/n]
		if !exclude[s.name] {
			out = append(out, s)
		}
	}
	return out
}

func (f *fleet) supName(i int) string { return f.sups[i].name }
