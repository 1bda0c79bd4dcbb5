package benchkit

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultDevenvDir is scripts/devenv's state directory when
// SHARDVISOR_DEVENV_DIR does not name another.
const DefaultDevenvDir = "/tmp/shardvisor-devenv"

// EnvOr is the environment variable k, or def when it is empty.
func EnvOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// EnvInt is the environment variable k as an integer, or def when it is
// not one.
func EnvInt(k string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return n
	}
	return def
}

// EnvDuration is the environment variable k as a duration, or def when it
// is not one.
func EnvDuration(k string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(k)); err == nil {
		return d
	}
	return def
}

// PasswordFile is where scripts/devenv keeps the PostgreSQL superuser's
// password in its state directory dir.
func PasswordFile(dir string) string { return filepath.Join(dir, "pg", "password") }

// ReadPassword reads the first line of a password file.
func ReadPassword(file string) (string, error) {
	pw, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(strings.SplitN(string(pw), "\n", 2)[0]), nil
}

// AdminDSN is the superuser's DSN for the postgres database at host
// (host:port).
func AdminDSN(host, password string) string {
	return (&url.URL{Scheme: "postgres", User: url.UserPassword("postgres", password), Host: host, Path: "/postgres", RawQuery: "sslmode=disable"}).String()
}

// Fatalf prints "name: message" on stderr and exits with code (2: usage,
// 1: a failed run).
func Fatalf(code int, name, format string, args ...any) {
	fmt.Fprintf(os.Stderr, name+": "+format+"\n", args...)
	os.Exit(code)
}
