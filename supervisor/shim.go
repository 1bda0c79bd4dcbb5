package supervisor

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// ShimArg is the hidden first argument that turns the supervisor binary
// into the exec shim. The supervisor starts every worker as
//
//	<supervisor binary> __exec-shim <command> <args...>
//
// and the shim, now running as the worker's process, sets LISTEN_PID (and
// WATCHDOG_PID) to its own pid and execs the real command in place. The
// systemd convention requires LISTEN_PID to equal the worker's pid, which
// Go's os/exec cannot know before fork+exec; exec keeps the pid, the
// inherited fds 3.. and the parent-death signal.
const ShimArg = "__exec-shim"

// MaybeRunShim runs the exec shim and never returns when the process was
// started as one; otherwise it returns at once. Call it first in main (and
// in TestMain of tests that run the supervisor in-process).
func MaybeRunShim() {
	if len(os.Args) < 2 || os.Args[1] != ShimArg {
		return
	}
	os.Exit(runShim(os.Args[2:]))
}

func runShim(argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "shardvisor exec shim: no command given")
		return 127
	}
	pid := strconv.Itoa(os.Getpid())
	if os.Getenv("LISTEN_FDS") != "" {
		os.Setenv("LISTEN_PID", pid)
	}
	if os.Getenv("WATCHDOG_USEC") != "" {
		os.Setenv("WATCHDOG_PID", pid)
	}
	// os.Environ now holds the worker's environment, PATH included, so the
	// lookup follows the PATH the config gave the worker.
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "shardvisor exec shim: worker command %q: %v\n", argv[0], err)
		return 127
	}
	err = syscall.Exec(path, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "shardvisor exec shim: exec %s: %v\n", path, err)
	return 127
}
