package main

import (
	"context"
	"errors"
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
	name  string // member name, sv-NN
	admin string // its admin address, 127.0.0.1:PORT
	p     *proc
	// dial reaches its sockets: from here, or from inside the isolated
	// host's namespace.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	hc   *http.Client
}

// get reads path from its admin address; a status but 200 is an error.
func (s *sup) get(path string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.admin+path, nil)
	res, err := s.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err == nil && res.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: status %d", path, res.StatusCode)
	}
	return b, err
}

// healthy: /healthz answers 200 (the supervisor's sockets are open).
func (s *sup) healthy(timeout time.Duration) bool {
	_, err := s.get("/healthz", timeout)
	return err == nil
}

// metrics is the counters this benchmark adds up across the fleet.
type metrics struct {
	spawns, kills float64
	killsBy       map[string]float64
	errs          []string // of the supervisors that did not answer
}

// fleet is one cluster with its supervisors and routers.
type fleet struct {
	b          *bench
	name, mode string
	boot       time.Duration
	c          *cluster
	sups       []*sup
	routers    []*proc
	ns         *netns
	iso        *isolation // supervisor 0's, when it is isolated
}

func adminAddr(i int) string { return "127.0.0.1:" + strconv.Itoa(*adminPortBase+i) }

// startFleet creates the cluster and starts the routers and supervisors;
// with isolate, supervisor 0 runs in a network namespace of its own.
func (b *bench) startFleet(ctx context.Context, name, mode string, boot time.Duration, isolate bool) (*fleet, error) {
	t0 := time.Now()
	f := &fleet{b: b, name: name, mode: mode, boot: boot}
	var err error
	if f.c, err = b.newCluster(ctx, name); err != nil {
		return nil, err
	}
	if _, _, err := topo.SetPoolConfig(ctx, b.sess, f.c.paths, poolName, b.poolConfig(mode, boot), -1); err != nil {
		return nil, err
	}
	zkArgs := []string{"--zk", b.env.ZKConnect(), "--zk-root", b.root, "--cluster", name,
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
		if f.iso, err = newIsolation(f.ns, b.env.zkAddrs, b.env.pgAddrs); err != nil {
			return f, err
		}
	}
	for i := range *routers {
		argv := append([]string{filepath.Join(b.binDir, "router"), "--listen", "127.0.0.1:" + strconv.Itoa(*routerPortBase+i), "--id", fmt.Sprintf("rt-%02d", i)}, zkArgs...)
		p, err := b.ps.start(fmt.Sprintf("rt-%02d.%s", i, name), argv...)
		if err != nil {
			return f, err
		}
		f.routers = append(f.routers, p)
	}
	var hostDial net.Dialer
	for i := range *supervisors {
		s := &sup{name: fmt.Sprintf("sv-%02d", i), admin: adminAddr(i), dial: hostDial.DialContext}
		argv := append([]string{filepath.Join(b.binDir, "supervisor"), "--pool", poolName, "--member", s.name, "--admin", s.admin,
			"--state-dir", filepath.Join(b.runDir, name, s.name), "--peer-secret-file", secret}, zkArgs...)
		if i == 0 && f.iso != nil {
			s.dial = f.ns.dial
			argv = append(f.ns.nsenter(), argv...)
		}
		s.hc = &http.Client{Transport: &http.Transport{DialContext: s.dial, MaxIdleConnsPerHost: 2}}
		if s.p, err = b.ps.start(fmt.Sprintf("sv-%02d.%s", i, name), argv...); err != nil {
			return f, err
		}
		f.sups = append(f.sups, s)
		// Half a second per ten: 2 cores booting a hundred workers at once
		// would make the first readiness figures meaningless.
		if i%10 == 9 {
			time.Sleep(500 * time.Millisecond)
		}
	}
	if err := f.settleNow(ctx, 3*time.Minute+3*boot); err != nil {
		return f, err
	}
	say("fleet %s: %d supervisors (map delivery %s%s), %d routers, cluster %s, up in %.1f s", name, len(f.sups), mode,
		when(boot > 0, ", %s boot", boot), len(f.routers), name, time.Since(t0).Seconds())
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

// settleNow waits until every supervisor serves the map's current
// version, and every router has it. The map is read again for up to a
// minute while ZooKeeper does not answer (after the outage).
func (f *fleet) settleNow(ctx context.Context, timeout time.Duration) error {
	m, _, err := f.c.st.Load(ctx)
	for t0 := time.Now(); err != nil && time.Since(t0) < time.Minute; {
		_ = benchkit.Sleep(ctx, 200*time.Millisecond)
		m, _, err = f.c.st.Load(ctx)
	}
	if err == nil {
		err = f.settle(ctx, m.Version, timeout)
	}
	return err
}

// underLoad runs event after the warmup of a load through a balancer in
// front of f's sample (but skip); tail after it, it stops the load and
// checks its acknowledged writes into v. d: the counters' change (but
// skip) from the event's start to the load's stop.
func (f *fleet) underLoad(ctx context.Context, name string, skip map[string]bool, tail time.Duration, v *verification, event func(*balancer, *loadRun) error) (l *loadRun, d metrics, err error) {
	lb := newBalancer(f.sample(skip))
	defer lb.close()
	if err := lb.waitUp(ctx, 30*time.Second); err != nil {
		return nil, d, err
	}
	l = startLoad(name, lb)
	defer l.Stop()
	if err := benchkit.Sleep(ctx, *warmup); err != nil {
		return nil, d, err
	}
	before := f.scrape(skip)
	if err := event(lb, l); err != nil {
		return nil, d, err
	}
	if err := benchkit.Sleep(ctx, tail); err != nil {
		return nil, d, err
	}
	l.Stop()
	d = f.scrape(skip).minus(before)
	*v, err = f.c.verify(ctx, l)
	return l, d, err
}

// settle waits until every supervisor serves and accepts at map version
// want or later, and every router has it.
func (f *fleet) settle(ctx context.Context, want uint64, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); ; {
		var serving, routers int
		var lagging []string
		seen := map[string]bool{}
		members, err := topo.ListPoolMembers(ctx, f.b.sess, f.c.paths, poolName)
		for _, e := range members {
			if e.Err != nil {
				continue
			}
			seen[e.Rec.Member] = true
			if e.Rec.State == "serving" && e.Rec.Accepting && e.Rec.MapVersion >= want {
				serving++
			} else {
				lagging = append(lagging, fmt.Sprintf("%s (%s, map %d)", e.Rec.Member, e.Rec.State, e.Rec.MapVersion))
			}
		}
		for _, s := range f.sups {
			if !seen[s.name] {
				lagging = append(lagging, s.name+" (no record)")
			}
		}
		rs, rerr := topo.ListRouters(ctx, f.b.sess, f.c.paths)
		for _, e := range rs {
			if e.Err == nil && e.Rec.MapVersion >= want {
				routers++
			}
		}
		if err = errors.Join(err, rerr); err == nil && serving == len(f.sups) && routers == len(f.routers) {
			return nil
		}
		if time.Now().After(deadline) {
			if len(lagging) > 8 {
				lagging = append(lagging[:8], fmt.Sprintf("and %d more", len(lagging)-8))
			}
			return fmt.Errorf("fleet %s not settled at map version %d after %s: %d/%d supervisors serving, %d/%d routers (%v; lagging: %s)",
				f.name, want, timeout, serving, len(f.sups), routers, len(f.routers), err, strings.Join(lagging, ", "))
		}
		if err := benchkit.Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// scrape adds up the counters of every supervisor (but skip) in parallel.
func (f *fleet) scrape(skip map[string]bool) metrics {
	var mu sync.Mutex
	var wg sync.WaitGroup
	total := metrics{killsBy: map[string]float64{}}
	for _, s := range f.sups {
		if skip[s.name] {
			continue
		}
		wg.Go(func() {
			body, err := s.get("/metrics", 5*time.Second)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				total.errs = append(total.errs, fmt.Sprintf("%s: %v", s.name, err))
				return
			}
			for line := range strings.Lines(string(body)) {
				name, val, _ := strings.Cut(line, " ")
				x, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
				switch {
				case err != nil || strings.HasPrefix(line, "#"):
				case name == "shardvisor_supervisor_worker_spawns_total":
					total.spawns += x
				case strings.HasPrefix(name, "shardvisor_supervisor_worker_kills_total"):
					total.kills += x
					if _, l, ok := strings.Cut(name, `reason="`); ok {
						total.killsBy[strings.TrimSuffix(l, `"}`)] += x
					}
				}
			}
		})
	}
	wg.Wait()
	return total
}

// minus is the change from o to m; errs are both's.
func (m metrics) minus(o metrics) metrics {
	d := metrics{spawns: m.spawns - o.spawns, kills: m.kills - o.kills, killsBy: map[string]float64{}, errs: append(o.errs, m.errs...)}
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
