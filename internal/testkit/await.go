package testkit

import (
	"testing"
	"time"
)

// Await receives from c until a value satisfies pred and returns it (a
// watch may skip intermediate values, never the latest), failing the test
// if none does within wait; what names the value in that message.
func Await[T any](t testing.TB, c <-chan T, wait time.Duration, what string, pred func(T) bool) T {
	t.Helper()
	deadline := time.After(wait)
	for {
		select {
		case v := <-c:
			if pred(v) {
				return v
			}
		case <-deadline:
			t.Fatalf("timed out after %v waiting for %s", wait, what)
		}
	}
}
