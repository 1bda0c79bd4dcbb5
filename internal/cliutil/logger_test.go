package cliutil

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/hint"
)

// memSink is a zap sink into a buffer, registered once per test binary
// under the scheme "memlog".
type memSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *memSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}
func (s *memSink) Sync() error  { return nil }
func (s *memSink) Close() error { return nil }
func (s *memSink) take() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.buf.String()
	s.buf.Reset()
	return out
}

var (
	sink     = &memSink{}
	sinkOnce sync.Once
)

func registerSink(t *testing.T) {
	sinkOnce.Do(func() {
		if err := zap.RegisterSink("memlog", func(*url.URL) (zap.Sink, error) { return sink, nil }); err != nil {
			t.Fatal(err)
		}
	})
}

// The process logger puts no Go stack under Error (nor Warn) in either
// format: those are operational states, logged every few seconds during an
// outage. A DPanic, a bug, still gets one.
func TestLoggerStacktraceOnlyForBugs(t *testing.T) {
	registerSink(t)
	for _, format := range []string{"json", "console"} {
		log, err := newLogger("debug", format, "memlog://")
		if err != nil {
			t.Fatal(err)
		}
		sink.take()
		log.Warn("a warning")
		log.Error("an error")
		out := sink.take()
		// Two lines; a stack would name this function (the caller field
		// names only the file).
		if !strings.Contains(out, "an error") || strings.Count(out, "\n") != 2 || strings.Contains(out, "TestLoggerStacktraceOnlyForBugs") {
			t.Errorf("%s: Warn and Error logged with a stack:\n%s", format, out)
		}
		func() {
			defer func() { _ = recover() }() // DPanic panics only in development mode
			log.DPanic("a bug")
		}()
		if out := sink.take(); !strings.Contains(out, "a bug") || !strings.Contains(out, "TestLoggerStacktraceOnlyForBugs") {
			t.Errorf("%s: DPanic logged without its stack:\n%s", format, out)
		}
	}
	if _, err := newLogger("debug", "xml", "memlog://"); err == nil {
		t.Error("format xml accepted")
	}
	if _, err := newLogger("loud", "json", "memlog://"); err == nil {
		t.Error("level loud accepted")
	}
}

// A daemon's log of an error says what to run, as the error's message did
// before the hints left it (package hint): the error's hint is a field of
// its own, also through a wrapping error and the logger's own fields. (A
// supervisor of a pool never set up logs the `shardctl pool set` to run,
// docs/supervisor.md.)
func TestLoggerWritesAnErrorsHint(t *testing.T) {
	registerSink(t)
	const h = "create it with `shardctl pool set web --file CONFIG.json` as the cluster's admin"
	err := fmt.Errorf("registering: %w", hint.New(errors.New("pool web is not set up in ZooKeeper"), h))
	for _, format := range []string{"json", "console"} {
		log, lerr := newLogger("debug", format, "memlog://")
		if lerr != nil {
			t.Fatal(lerr)
		}
		sink.take()
		log.Warn("registering the member record failed", zap.Error(err))
		log.With(zap.Error(err)).Info("with the logger's fields")
		log.Warn("plain", zap.Error(errors.New("plain")))
		out := strings.Split(strings.TrimSpace(sink.take()), "\n")
		if len(out) != 3 {
			t.Fatalf("%s: %d lines:\n%s", format, len(out), strings.Join(out, "\n"))
		}
		for _, line := range out[:2] {
			if !strings.Contains(line, "pool web is not set up") || !strings.Contains(line, "shardctl pool set web") {
				t.Errorf("%s: the error's hint is not logged: %s", format, line)
			}
		}
		if strings.Contains(out[2], `"hint":`) {
			t.Errorf("%s: an error without a hint logged one: %s", format, out[2])
		}
	}
}

// The hint field leaves the JSON format's sampling as zap's production
// config has it (the first 100 of an entry a second, then every 100th):
// a log storm during an outage stays bounded.
func TestLoggerKeepsSampling(t *testing.T) {
	registerSink(t)
	log, err := newLogger("debug", "json", "memlog://")
	if err != nil {
		t.Fatal(err)
	}
	sink.take()
	for range 300 {
		log.Warn("the same warning", zap.Error(hint.New(errors.New("x"), "y")))
	}
	if n := strings.Count(sink.take(), "\n"); n >= 300 {
		t.Errorf("%d of 300 entries logged in one second: not sampled", n)
	}
}
