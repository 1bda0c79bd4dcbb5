// Package hint carries, with an error, what the operator should run to
// mend it: the error's message says what is wrong, its hint says what to
// do ("shardctl move resume b3-l0-v7-a1b2c3"). The commands print the
// hint on a line of its own ("hint: ..."), and as a field of its own under
// --json, so that neither is lost in a long message.
//
// An error wrapped around a hinted one (fmt.Errorf with %w) keeps its
// hint: Of finds it anywhere in the chain.
package hint

import "errors"

// Error is an error with a hint. Its message is Err's alone.
type Error struct {
	Err  error
	Hint string
}

func (e *Error) Error() string { return e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

// New returns err with hint; nil if err is nil, err itself if hint is
// empty.
func New(err error, hint string) error {
	if err == nil || hint == "" {
		return err
	}
	return &Error{Err: err, Hint: hint}
}

// Text is err's message followed by its hint, if it has one, for where
// only text is kept (a record's error field): "message (hint: ...)".
func Text(err error) string {
	if h := Of(err); h != "" {
		return err.Error() + " (hint: " + h + ")"
	}
	return err.Error()
}

// Of returns the first hint in err's chain, or "".
func Of(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Hint
	}
	return ""
}
