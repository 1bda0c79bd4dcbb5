// Package version says which build a binary is: the module's version and
// the commit it was built from, for --version, the logs and the
// shardvisor_build_info metric. The Go toolchain stamps both into every
// binary built from a module in a git checkout (debug.ReadBuildInfo:
// the main module's version, vcs.revision, vcs.modified); make dist sets
// Version from git describe, since a checkout's module version is
// "(devel)".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Version and Revision, when set by the linker (-X), override what the
// toolchain stamped: make build and make dist set them from git (this
// machine's GOFLAGS has -buildvcs=false, and a tarball's binaries must
// say their commit wherever they were built).
var Version, Revision string

// Info is one binary's build.
type Info struct {
	Version  string `json:"version"`  // module version, "(devel)" for a checkout's build
	Revision string `json:"revision"` // commit, "unknown" without VCS stamping
	Modified bool   `json:"modified"` // built from a tree with uncommitted changes
	Time     string `json:"time,omitempty"`
	Go       string `json:"go"`
}

// Get reads the running binary's build information.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	i := fromBuildInfo(bi, ok, Version)
	if Revision != "" {
		i.Revision, i.Modified = strings.TrimSuffix(Revision, "-dirty"), strings.HasSuffix(Revision, "-dirty")
	}
	return i
}

func fromBuildInfo(bi *debug.BuildInfo, ok bool, override string) Info {
	i := Info{Version: "(devel)", Revision: "unknown", Go: runtime.Version()}
	if ok && bi != nil {
		if v := bi.Main.Version; v != "" {
			i.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Revision = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			case "vcs.time":
				i.Time = s.Value
			}
		}
		if bi.GoVersion != "" {
			i.Go = bi.GoVersion
		}
	}
	if override != "" {
		i.Version = override
	}
	return i
}

// Short is the revision's first 12 characters, "+dirty" when modified.
func (i Info) Short() string {
	r := i.Revision
	if len(r) > 12 {
		r = r[:12]
	}
	if i.Modified {
		r += "+dirty"
	}
	return r
}

// String is what --version prints after the program's name:
// "v0.44.0 (commit 0123456789ab, 2026-11-30T12:00:00Z, go1.22.5)".
func (i Info) String() string {
	s := fmt.Sprintf("%s (commit %s", i.Version, i.Short())
	if i.Time != "" {
		s += ", " + i.Time
	}
	return s + ", " + i.Go + ")"
}

// Collector is the shardvisor_build_info gauge, 1 and labelled with the
// build: a dashboard shows which versions a fleet runs mid-upgrade, and
// `count by (version) (shardvisor_build_info)` says when one is done.
func Collector() prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardvisor_build_info",
		Help:        "Always 1: the process's build (module version, commit, Go version) as labels.",
		ConstLabels: prometheus.Labels{"version": i.Version, "revision": i.Short(), "goversion": i.Go}})
	g.Set(1)
	return g
}
