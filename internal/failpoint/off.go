//go:build !failpoints

package failpoint

// Enabled reports whether this build has failpoints.
const Enabled = false

// Inject does nothing: this build has no failpoints.
func Inject(string) {}
