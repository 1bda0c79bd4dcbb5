//go:build failpoints

package failpoint

import (
	"fmt"
	"os"
	"syscall"
)

// Enabled reports whether this build has failpoints.
const Enabled = true

// target is read once: a failpoint is chosen when the process starts.
var target = os.Getenv(Env)

// Inject kills the process with SIGKILL if name is the failpoint chosen
// by SHARDVISOR_FAILPOINT, saying so on stderr first (the only trace a
// test gets of why the process died).
func Inject(name string) {
	if name == "" || name != target {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint %s: killing the process (SIGKILL)\n", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
