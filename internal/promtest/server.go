package promtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

// Server is a Prometheus server a test started: its own port, its own
// storage in the test's temporary directory, stopped (by its pid) when
// the test ends.
type Server struct {
	Client
	// Dir holds prometheus.yml, rules/ (the copies loaded), data/ and
	// prometheus.log.
	Dir string
	// Rewrites are the durations Config.MaxFor shortened in the copies.
	Rewrites []Rewrite
	// RuleFiles are the copies the server loaded.
	RuleFiles []string
	Pid       int

	cmd    *exec.Cmd
	exited chan struct{}
}

// Log is the tail of the server's log (its last n lines).
func (s *Server) Log(n int) string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "prometheus.log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Start starts Prometheus as c says on a free loopback port, waits until
// it is ready (its rule files loaded: a rule that does not parse fails
// the test with the server's words), and stops it when the test ends.
// It skips under -short, like every test that starts a server.
func Start(t testing.TB, c Config) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("starts Prometheus: skipped with -short")
	}
	c = c.withDefaults()
	if _, err := os.Stat(c.Binary); err != nil {
		t.Fatalf("promtest: %v (scripts/install-deps installs Debian's prometheus)", err)
	}
	s := &Server{Dir: t.TempDir(), exited: make(chan struct{})}
	if err := s.prepare(c); err != nil {
		t.Fatalf("promtest: %v", err)
	}
	port := testenv.FreePort(t)
	s.URL = "http://127.0.0.1:" + strconv.Itoa(port)
	log, err := os.Create(filepath.Join(s.Dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(c.Binary,
		"--config.file="+filepath.Join(s.Dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(s.Dir, "data"),
		"--storage.tsdb.retention.time=1d",
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(port),
		"--log.level=info")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	// Its own process group: a ^C of the test run reaches the test, whose
	// cleanup stops the server, and not the server first. Should the test
	// process die without its cleanups (a timeout's panic), the kernel
	// stops the server (Pdeathsig).
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := s.cmd.Start(); err != nil {
		log.Close()
		t.Fatalf("promtest: starting %s: %v", c.Binary, err)
	}
	s.Pid = s.cmd.Process.Pid
	go func() { _ = s.cmd.Wait(); log.Close(); close(s.exited) }()
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("promtest: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for !s.Ready(ctx) {
		select {
		case <-s.exited:
			t.Fatalf("promtest: prometheus exited at start (%v):\n%s", s.cmd.ProcessState, s.Log(20))
		case <-ctx.Done():
			t.Fatalf("promtest: prometheus not ready on %s after 60 s:\n%s", s.URL, s.Log(20))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return s
}

// prepare writes the server's directory: the rule files' copies
// (shortened) and prometheus.yml.
func (s *Server) prepare(c Config) error {
	rules := filepath.Join(s.Dir, "rules")
	if err := os.MkdirAll(rules, 0o755); err != nil {
		return err
	}
	for _, f := range c.RuleFiles {
		src, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		out, rw, err := Shorten(filepath.Base(f), src, c.MaxFor)
		if err != nil {
			return err
		}
		dst := filepath.Join(rules, filepath.Base(f))
		if err := os.WriteFile(dst, out, 0o644); err != nil {
			return err
		}
		s.Rewrites = append(s.Rewrites, rw...)
		s.RuleFiles = append(s.RuleFiles, dst)
	}
	cfg, err := c.Render(s.RuleFiles)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.Dir, "prometheus.yml"), cfg, 0o644)
}

// Stop stops the server it started, by its pid: SIGTERM, then SIGKILL
// after 20 s. It may be called more than once.
func (s *Server) Stop() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	select {
	case <-s.exited:
		return nil
	default:
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stopping prometheus (pid %d): %w", s.Pid, err)
	}
	select {
	case <-s.exited:
		return nil
	case <-time.After(20 * time.Second):
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	return fmt.Errorf("prometheus (pid %d) did not stop within 20 s of SIGTERM; killed", s.Pid)
}
