package hint

import (
	"errors"
	"fmt"
	"io"
	"testing"
)

func TestHint(t *testing.T) {
	base := errors.New("move m1 stopped in copy")
	err := New(base, "shardctl move resume m1")
	if err.Error() != "move m1 stopped in copy" {
		t.Errorf("message %q: the hint must not be in it", err.Error())
	}
	if got := Of(err); got != "shardctl move resume m1" {
		t.Errorf("Of = %q", got)
	}
	wrapped := fmt.Errorf("rebalance: %w", err)
	if got := Of(wrapped); got != "shardctl move resume m1" {
		t.Errorf("Of(wrapped) = %q", got)
	}
	if !errors.Is(wrapped, base) {
		t.Error("the chain lost the error under the hint")
	}
	joined := errors.Join(io.EOF, wrapped)
	if got := Of(joined); got != "shardctl move resume m1" {
		t.Errorf("Of(joined) = %q", got)
	}
	if got := Text(wrapped); got != "rebalance: move m1 stopped in copy (hint: shardctl move resume m1)" {
		t.Errorf("Text = %q", got)
	}
	if Text(base) != base.Error() {
		t.Errorf("Text without a hint = %q", Text(base))
	}
	if Of(base) != "" || Of(nil) != "" {
		t.Error("a hint where there is none")
	}
	if New(nil, "x") != nil {
		t.Error("New(nil) is not nil")
	}
	if New(base, "") != base {
		t.Error("New without a hint wraps")
	}
}

// TestOuterHintFirst: an error wrapped twice with hints gives the outer,
// which knows more about what the operator ran.
func TestOuterHintFirst(t *testing.T) {
	err := New(fmt.Errorf("outer: %w", New(errors.New("inner"), "inner hint")), "outer hint")
	if got := Of(err); got != "outer hint" {
		t.Errorf("Of = %q, want the outer hint", got)
	}
}
