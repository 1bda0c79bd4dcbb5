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

// startProbe probes w at addr until it is reaped, posting a pass when the
// worker starts passing and every failure (the machine counts them).
func (s *Supervisor) startProbe(w *worker, addr string, p topo.WorkerProbe) {
	ctx, cancel := context.WithCancel(context.Background())
	s.probes[w] = cancel
	url := "http://" + addr + p.Path
	client := &http.Client{Timeout: p.Timeout.D(), Transport: &http.Transport{DisableKeepAlives: true}}
	go func() {
		passing, everPassed := false, false
		wait := probeFirstEvery
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			why := probeOnce(ctx, client, url)
			if ctx.Err() != nil {
				return
			}
			switch {
			case why == "" && passing:
				continue
			case why == "":
				passing, everPassed, wait = true, true, p.Interval.D()
			case !everPassed:
				continue // still booting: readiness.timeout bounds it
			default:
				passing = false
			}
			select {
			case s.events <- evProbe{w: w, ok: passing, why: why}:
			case <-ctx.Done():
				return
			}
		}
	}()
}

// probeOnce is one GET: "" when it answered 2xx, else why not.
func probeOnce(ctx context.Context, c *http.Client, url string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err.Error()
	}
	resp, err := c.Do(req)
	if err != nil {
		return err.Error()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Sprintf("status %d", resp.StatusCode)
	}
	return ""
}
