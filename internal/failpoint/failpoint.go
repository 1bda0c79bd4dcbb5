// Package failpoint marks the places where a test may kill a process, to
// check that what it leaves behind is recovered (a mover killed on
// entering each step of a move, for one).
//
// Inject is a no-op, and Enabled false, unless the binary is built with
// `-tags failpoints`. In such a build, Inject(name) kills the process with
// SIGKILL, at once and without cleanup, when the environment variable
// SHARDVISOR_FAILPOINT equals name. Production builds carry no hook and
// read no variable.
package failpoint

// Env names the failpoint a failpoints build kills itself at.
const Env = "SHARDVISOR_FAILPOINT"
