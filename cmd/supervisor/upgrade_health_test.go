package main

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

// Six USR2 upgrades in a row under 8 load-balancer health checkers, each
// on a new connection every millisecond: every check is answered. Before
// the admin server's stop answered what it had accepted, 17 of ~74,000
// checks over 36 upgrades failed with EOF (5 of 6 runs of this test).
func TestFaultsUpgradeAnswersEveryHealthCheck(t *testing.T) {
	testenv.Faults(t)
	e := newUpgradeEnv(t)
	_, _ = e.start()
	e.waitServing(e.lockHolder())
	var ok, failed atomic.Int64
	var mu sync.Mutex
	var errs []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
				resp, err := c.Get("http://" + e.admin + "/healthz")
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					ok.Add(1)
					continue
				}
				failed.Add(1)
				mu.Lock()
				errs = append(errs, time.Now().Format("15:04:05.000000")+" "+err.Error())
				mu.Unlock()
			}
		}()
	}
	for range 6 {
		mid := e.lockHolder()
		if err := syscall.Kill(mid, syscall.SIGUSR2); err != nil {
			t.Fatal(err)
		}
		e.waitFor(120*time.Second, "the upgrade", func() bool { h := e.lockHolder(); return h != mid && !alive(mid) })
		e.waitServing(e.lockHolder())
	}
	close(stop)
	wg.Wait()
	t.Logf("%d health checks answered, %d failed, over 6 upgrades", ok.Load(), failed.Load())
	if failed.Load() > 0 {
		t.Errorf("health checks failed during upgrades, e.g. %v", errs[:min(len(errs), 5)])
	}
}
