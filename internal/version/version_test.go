package version

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-11-30T12:00:00Z"}}}
	i := fromBuildInfo(bi, true, "")
	if i.Version != "v1.2.3" || i.Revision != "0123456789abcdef0123" || !i.Modified || i.Go != "go1.99" {
		t.Fatalf("fromBuildInfo = %+v", i)
	}
	if got, want := i.String(), "v1.2.3 (commit 0123456789ab+dirty, 2026-11-30T12:00:00Z, go1.99)"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	// make dist's -X wins over the module's "(devel)".
	if i := fromBuildInfo(bi, true, "v0.44.0-3-gabc"); i.Version != "v0.44.0-3-gabc" {
		t.Fatalf("override: %+v", i)
	}
	// No build information (a test binary may lack VCS stamping): still
	// a version line, never an empty one.
	if s := fromBuildInfo(nil, false, "").String(); !strings.HasPrefix(s, "(devel) (commit unknown, go") {
		t.Fatalf("no build info: %q", s)
	}
}

func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector())
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "shardvisor_build_info" {
		t.Fatalf("gathered %v, %v", mfs, err)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if m.GetGauge().GetValue() != 1 || labels["version"] != Get().Version || labels["revision"] != Get().Short() || labels["goversion"] == "" {
		t.Fatalf("build_info = %v %v", m.GetGauge().GetValue(), labels)
	}
}
