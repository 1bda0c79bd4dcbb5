package supervisor

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// ShimArg is the hidden first argument that turns the supervisor binary
// into a worker's keeper (keeper.go). The supervisor starts every worker
// as
//
//	<supervisor binary> __exec-shim <command> <args...>
//
// and that process stays as the worker's parent for its whole life: it
// starts the worker as its child, forwards signals to it, kills the
// worker's whole process tree when the supervisor dies, and exits as the
// worker did.
const ShimArg = "__exec-shim"

// childArg is the keeper's second mode: the worker's own process, which
// sets LISTEN_PID (and WATCHDOG_PID) to its pid and execs the command in
// place. The systemd convention requires LISTEN_PID to equal the worker's
// pid, which Go cannot know before fork+exec; exec keeps the pid, the
// inherited fds 3.. and the parent-death signal.
const childArg = "__exec-child"

// MaybeRunShim runs the keeper or the exec shim and never returns when the
// process was started as one; otherwise it returns at once. Call it first
// in main (and in TestMain of tests that run the supervisor in-process).
func MaybeRunShim() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case ShimArg:
		os.Exit(runKeeper(osEnv, os.Args[2:]))
	case childArg:
		os.Exit(runShim(osEnv, os.Args[2:]))
	}
}

func runShim(e *env, argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "shardvisor exec shim: no command given")
		return 127
	}
	pid := strconv.Itoa(os.Getpid())
	if e.getenv("LISTEN_FDS") != "" {
		_ = e.setenv("LISTEN_PID", pid)
	}
	if e.getenv("WATCHDOG_USEC") != "" {
		_ = e.setenv("WATCHDOG_PID", pid)
	}
	// The environment now is the worker's, PATH included, so the lookup
	// follows the PATH the config gave the worker.
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "shardvisor exec shim: worker command %q: %v\n", argv[0], err)
		return 127
	}
	err = syscall.Exec(path, argv, e.environ())
	fmt.Fprintf(os.Stderr, "shardvisor exec shim: exec %s: %v\n", path, err)
	return 127
}
