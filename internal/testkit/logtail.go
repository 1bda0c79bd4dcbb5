package testkit

import (
	"os"
	"testing"
)

// logTailMax is how much of a log LogTail shows: its end, where a failing
// test's cause is.
const logTailMax = 60000

// LogTail logs the last 60 kB of the file at path, under label, when the
// test failed or SHARDVISOR_TEST_LOG is set. Call it from t.Cleanup, before
// the file is closed.
func LogTail(t testing.TB, path, label string) {
	t.Helper()
	if !t.Failed() && os.Getenv("SHARDVISOR_TEST_LOG") == "" {
		return
	}
	b, _ := os.ReadFile(path)
	if len(b) > logTailMax {
		b = b[len(b)-logTailMax:]
	}
	t.Logf("%s:\n%s", label, b)
}
