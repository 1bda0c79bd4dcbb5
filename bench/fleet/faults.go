package main

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/faultproxy"
	"github.com/shardvisor/shardvisor/zksession"
)

// ---------------------------------------------------------------- isolate

// IsolateResult is one supervisor cut off from ZooKeeper and its peers.
type IsolateResult struct {
	Member        string       `json:"member"`
	SessionMS     float64      `json:"negotiated_session_timeout_ms"`
	BoundMS       float64      `json:"bound_ms"` // 2/3 T + 1 s
	RefusedMS     float64      `json:"port_refused_ms"`
	HealthzMS     float64      `json:"healthz_failed_ms"`
	OutMS         float64      `json:"out_of_lb_ms"` // the first of the two
	BalancerMS    float64      `json:"balancer_marked_down_ms"`
	BackMS        float64      `json:"back_after_heal_ms"`
	OwnFailed     int          `json:"isolated_host_failed_requests"`
	OthersFailed  int          `json:"others_failed_requests"`
	Load          loadStats    `json:"load"`
	Verify        verification `json:"verify"`
	Kills         float64      `json:"worker_kills"`
	KillsByReason map[string]float64
}

func (b *bench) isolate(ctx context.Context, f *fleet) error {
	if f.iso == nil {
		return errors.New("no isolated host in this fleet")
	}
	// T of the isolation bound: what the ensemble grants a session that
	// asks for the supervisors' timeout (the server clamps it).
	zs, err := zksession.Open(zksession.Config{Connect: b.env.ZKConnect(), SessionTimeout: *sessionTimeout})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = zs.WaitConnected(wctx)
	cancel()
	T := zs.SessionTimeout()
	if zs.Close(); err != nil {
		return err
	}
	s := f.sups[0]
	res := &IsolateResult{Member: s.name, SessionMS: benchkit.MS(T), BoundMS: benchkit.MS(2*T/3 + time.Second), RefusedMS: -1, HealthzMS: -1, OutMS: -1, BalancerMS: -1, BackMS: -1}
	b.res.Isolate = res
	var cut time.Duration
	l, d, err := f.underLoad(ctx, "iso", nil, 2*time.Second, &res.Verify, func(lb *balancer, l *loadRun) error {
		isoBE := lb.backends[0] // the sample's first: supervisor 0, the isolated one
		port := s.servicePort()
		say("isolate: cutting %s (port %d) off from ZooKeeper and its %d peers (blackholing proxies)", s.name, port, len(f.sups)-1)
		t0 := time.Now()
		cut = time.Since(l.started)
		f.iso.set(faultproxy.Blackhole)
		for deadline := t0.Add(2*T + 5*time.Second); time.Now().Before(deadline) && (res.RefusedMS < 0 || res.HealthzMS < 0); {
			if res.RefusedMS < 0 {
				dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				c, err := s.dial(dctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
				cancel()
				if err == nil {
					c.Close()
				} else if errors.Is(err, syscall.ECONNREFUSED) {
					res.RefusedMS = benchkit.MS(time.Since(t0))
				}
			}
			if res.HealthzMS < 0 && !s.healthy(300*time.Millisecond) {
				res.HealthzMS = benchkit.MS(time.Since(t0))
			}
			if err := benchkit.Sleep(ctx, 20*time.Millisecond); err != nil {
				return err
			}
		}
		if res.OutMS = res.HealthzMS; res.RefusedMS >= 0 && (res.OutMS < 0 || res.RefusedMS < res.OutMS) {
			res.OutMS = res.RefusedMS
		}
		if err := benchkit.Sleep(ctx, 3*time.Second); err != nil { // the others serve on
			return err
		}
		if down := time.Unix(0, isoBE.downAt.Load()); down.After(t0) {
			res.BalancerMS = benchkit.MS(down.Sub(t0))
		}
		say("isolate: %s out of the load balancer; healing", s.name)
		th := time.Now()
		f.iso.set(faultproxy.Pass)
		if err := f.settleNow(ctx, 2*time.Minute); err != nil {
			return err
		}
		for !s.healthy(time.Second) {
			if err := benchkit.Sleep(ctx, 50*time.Millisecond); err != nil {
				return err
			}
		}
		res.BackMS = benchkit.MS(time.Since(th))
		return nil
	})
	if err != nil {
		return err
	}
	res.Kills, res.KillsByReason = d.kills, d.killsBy
	res.Load = l.stats(cut)
	res.OwnFailed = res.Load.FailedOn[s.name]
	res.OthersFailed = res.Load.Failed - res.OwnFailed
	return nil
}

// ---------------------------------------------------------------- outage

// OutageResult is the whole ZooKeeper ensemble down under load.
type OutageResult struct {
	DownS         float64            `json:"killed_seconds"`
	RestartS      float64            `json:"restart_seconds"`                      // devenv up until healthy
	NormalS       float64            `json:"back_to_normal_seconds_after_restart"` // restart begun -> every member serving
	NormalHealthy float64            `json:"back_to_normal_seconds_after_healthy"` // ensemble healthy -> every member serving
	Kills         float64            `json:"worker_kills"`
	KillsByReason map[string]float64 `json:"worker_kills_by_reason,omitempty"`
	Boots         float64            `json:"worker_boots"`
	Load          loadStats          `json:"load"`
	Verify        verification       `json:"verify"`
}

func (b *bench) outage(ctx context.Context, f *fleet) error {
	res := &OutageResult{}
	b.res.Outage = res
	l, d, err := f.underLoad(ctx, "out", nil, 3*time.Second, &res.Verify, func(lb *balancer, l *loadRun) (err error) {
		say("outage: killing all 3 ZooKeeper servers of the throwaway ensemble (%s) for %s under load", b.env.ZKConnect(), *outageFor)
		t0 := time.Now()
		var tRestart time.Time
		restart := func() error {
			res.DownS = time.Since(t0).Seconds()
			tRestart = time.Now()
			err := b.env.Up()
			res.RestartS = time.Since(tRestart).Seconds()
			return err
		}
		// However this ends, the ensemble comes back.
		defer func() {
			if tRestart.IsZero() {
				err = errors.Join(err, restart())
			}
		}()
		for i := 1; i <= 3; i++ {
			if err := b.env.ZKKill(i); err != nil {
				return err
			}
		}
		for left := *outageFor; left > 0; left -= 10 * time.Second {
			say("outage: ZooKeeper down %2.0f s; %d/%d supervisors behind the balancer up; %d requests failed so far",
				time.Since(t0).Seconds(), len(lb.backends)-len(lb.down()), len(lb.backends), l.stats(0).Failed)
			if err := benchkit.Sleep(ctx, min(left, 10*time.Second)); err != nil {
				return err
			}
		}
		if err := restart(); err != nil {
			return err
		}
		say("outage: ensemble back (devenv up took %.1f s); waiting for every member record, serving", res.RestartS)
		tr := time.Now()
		if err := f.settleNow(ctx, 3*time.Minute); err != nil {
			return err
		}
		if err := lb.waitUp(ctx, time.Minute); err != nil {
			return err
		}
		res.NormalS, res.NormalHealthy = time.Since(tRestart).Seconds(), time.Since(tr).Seconds()
		return nil
	})
	if err != nil {
		return err
	}
	res.Kills, res.KillsByReason, res.Boots = d.kills, d.killsBy, d.spawns
	res.Load = l.stats(0)
	return nil
}
