package promtest

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

const testRules = `groups:
- name: promtest
  rules:
  - record: promtest:value:max
    expr: max(promtest_value)
  - alert: PromtestHigh
    expr: promtest_value > 1
    for: 10m
    labels: {severity: page}
`

// The harness against Debian's Prometheus: it scrapes a target, loads
// rules from a shortened copy, and its API answers, typed; an alert fires
// and resolves; Stop ends the process it started.
func TestIntegrationPrometheus(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "promtest_value", Help: "a test's value"})
	reg.MustRegister(g)
	target := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer target.Close()
	rules := filepath.Join(t.TempDir(), "test.rules.yml")
	if err := os.WriteFile(rules, []byte(testRules), 0o644); err != nil {
		t.Fatal(err)
	}
	s := Start(t, Config{
		Jobs:      []Job{{Name: "promtest", Static: []Static{{Targets: []string{strings.TrimPrefix(target.URL, "http://")}, Labels: map[string]string{"zone": "a"}}}}},
		RuleFiles: []string{rules},
		MaxFor:    time.Second,
	})
	if len(s.Rewrites) != 1 || s.Rewrites[0].String() != "test.rules.yml: PromtestHigh for: 10m -> 1s" {
		t.Fatalf("rewrites: %v", s.Rewrites)
	}
	ctx := context.Background()
	testenv.WaitFor(t, 30*time.Second, func() bool {
		ts, err := s.Targets(ctx)
		return err == nil && len(ts) == 1 && ts[0].Health == "up" && ts[0].Labels["zone"] == "a"
	}, "the target scraped (up)")
	groups, err := s.Rules(ctx)
	if err != nil || len(groups) != 1 || len(groups[0].Rules) != 2 {
		t.Fatalf("rules: %+v %v", groups, err)
	}
	if r := groups[0].Rules[1]; r.Name != "PromtestHigh" || r.For() != time.Second {
		t.Fatalf("alerting rule as loaded: %+v", r)
	}
	testenv.WaitFor(t, 30*time.Second, func() bool {
		r, err := s.Query(ctx, "promtest:value:max")
		return err == nil && !r.Empty() && r.Vector[0].Value == 0
	}, "the recording rule's series")

	g.Set(2)
	state := func(want string) func() bool {
		return func() bool {
			alerts, err := s.Alerts(ctx)
			st, _ := AlertState(alerts, "PromtestHigh")
			return err == nil && st == want
		}
	}
	testenv.WaitFor(t, 30*time.Second, state("firing"), "PromtestHigh firing")
	g.Set(0)
	testenv.WaitFor(t, 30*time.Second, state("inactive"), "PromtestHigh resolved")

	if _, err := s.Query(ctx, "sum("); err == nil {
		t.Fatal("a query that does not parse was answered")
	}
	pid := s.Pid
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("prometheus (pid %d) still runs after Stop", pid)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("a second Stop: %v", err)
	}
}

// A rule file that does not parse fails the start with Prometheus's words.
func TestIntegrationPrometheusBadRules(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Prometheus: skipped with -short")
	}
	rules := filepath.Join(t.TempDir(), "bad.yml")
	if err := os.WriteFile(rules, []byte("groups:\n- name: g\n  rules:\n  - record: x\n    expr: sum(\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ft := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(ft, Config{Jobs: []Job{{Name: "j", Static: []Static{Targets("127.0.0.1:1")}}}, RuleFiles: []string{rules}})
	}()
	<-done
	if !strings.Contains(ft.msg, "prometheus exited at start") || !strings.Contains(ft.msg, "parse error") {
		t.Fatalf("start with a bad rule file: %q", ft.msg)
	}
}

// fatalRecorder keeps the message of a Fatalf and ends the goroutine
// (Start runs on one of its own for it).
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
