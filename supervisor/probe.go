package supervisor

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/shardvisor/shardvisor/topo"
)

// The HTTP probe of a pool config's "probe": every worker gets a private
// loopback socket of its own (the last of LISTEN_FDS, named
// workerproto.ProbeFDName), so a probe reaches exactly that worker. A
// probe through the shared listen socket would reach whichever worker
// accepted first and could never say which one hangs.

// probeFirstEvery is how often a booting worker is probed until its first
// pass: readiness waits for it, so the probe interval would be a delay.
const probeFirstEvery = 100 * time.Millisecond

// bindProbe binds a loopback socket on an ephemeral port for one worker.
func bindProbe() (*os.File, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", fmt.Errorf("binding the worker's probe socket: %w", err)
	}
	addr := ln.Addr().String()
	f, err := detach(ln)
	_ = ln.Close()
	if err != nil {
		return nil, "", fmt.Errorf("binding the worker's probe socket: %w", err)
	}
	return f, addr, nil
}

// probeRun is one worker's probe loop: cancel ends it, claimed tells it
// that the worker has said it is ready (actProbeNow).
type probeRun struct {
	cancel  context.CancelFunc
	claimed chan struct{} // closed once
}

// startProbe probes w at addr until it is reaped, posting a pass when the
// worker starts passing and every failure (the machine counts them).
//
// Before the worker says READY=1 a failure is only a worker still booting
// and is not posted (readiness.timeout bounds it). From READY=1 on
// (claimed, see claimProbe) the worker accepts on the shared sockets, so
// it is probed at once, and a failure before its first pass is posted as
// first: the machine kills it, because every request it takes meanwhile
// is another failed request (a broken deploy that boots).
func (s *Supervisor) startProbe(w *worker, addr string, p topo.WorkerProbe) {
	ctx, cancel := context.WithCancel(context.Background())
	run := &probeRun{cancel: cancel, claimed: make(chan struct{})}
	s.probes[w] = run
	url := "http://" + addr + p.Path
	client := &http.Client{Timeout: p.Timeout.D(), Transport: &http.Transport{DisableKeepAlives: true}}
	go func() {
		passing, everPassed, claimed := false, false, false
		claimCh := run.claimed
		wait := probeFirstEvery
		for {
			select {
			case <-ctx.Done():
				return
			case <-claimCh:
				// Probe now: a probe that began before the claim says
				// nothing about the worker after it.
				claimed, claimCh = true, nil
			case <-time.After(wait):
			}
			wasClaimed := claimed
			why, answered := probeOnce(ctx, client, url)
			if ctx.Err() != nil {
				return
			}
			first := false
			switch {
			case why == "" && passing:
				continue
			case why == "":
				passing, everPassed, wait = true, true, p.Interval.D()
			case !everPassed && !wasClaimed:
				continue // still booting: readiness.timeout bounds it
			case !everPassed:
				first = true
			default:
				passing = false
			}
			select {
			case s.events <- evProbe{w: w, ok: passing, why: why, first: first, answered: answered}:
			case <-ctx.Done():
				return
			}
		}
	}()
}

// claimProbe tells w's probe loop that w said it is ready (actProbeNow).
func (s *Supervisor) claimProbe(w *worker) {
	if run := s.probes[w]; run != nil {
		select {
		case <-run.claimed:
		default:
			close(run.claimed)
		}
	}
}

// probeOnce is one GET: "" when it answered 2xx, else why not; answered:
// the worker sent a status (it accepts and serves), not a timeout or an
// error before one.
func probeOnce(ctx context.Context, c *http.Client, url string) (string, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err.Error(), false
	}
	resp, err := c.Do(req)
	if err != nil {
		return err.Error(), false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Sprintf("status %d", resp.StatusCode), true
	}
	return "", true
}
