package supervisor

import "os"

// env is the process environment the supervisor reads and changes, and
// the executable it re-executes (as an exec shim, a keeper, or the new
// binary of an upgrade). Everything in the package goes through one, so
// that tests can give a fake in place of the process's own (the seam of
// cloudflare/tableflip's env).
type env struct {
	getenv     func(key string) string
	setenv     func(key, value string) error
	unsetenv   func(key string) error
	environ    func() []string
	executable func() (string, error)
}

// osEnv is the process's own environment and executable.
var osEnv = &env{
	getenv:     os.Getenv,
	setenv:     os.Setenv,
	unsetenv:   os.Unsetenv,
	environ:    os.Environ,
	executable: os.Executable,
}
