package cliutil

import (
	"bytes"
	"net/url"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"
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

// The process logger puts no Go stack under Error (nor Warn) in either
// format: those are operational states, logged every few seconds during an
// outage. A DPanic, a bug, still gets one.
func TestLoggerStacktraceOnlyForBugs(t *testing.T) {
	sinkOnce.Do(func() {
		if err := zap.RegisterSink("memlog", func(*url.URL) (zap.Sink, error) { return sink, nil }); err != nil {
			t.Fatal(err)
		}
	})
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
