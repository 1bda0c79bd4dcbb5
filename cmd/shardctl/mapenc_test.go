package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

// map-encoding shows the form, switches it, writes nothing when it is
// already in place, and every other command reads the compressed map.
func TestIntegrationMapEncoding(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	cmd := clusterCmd(z, "enc")
	mustRun(t, cmd("init", "--level", "10", "--seed", seed, "--node", "pg1=postgres://postgres@127.0.0.1:1/app", "--node", "pg2=postgres://postgres@127.0.0.1:2/app")...)

	type answer struct {
		Encoding    string `json:"encoding"`
		Changed     bool   `json:"changed"`
		MapVersion  uint64 `json:"map_version"`
		StoredBytes int    `json:"stored_bytes"`
		PlainBytes  int    `json:"plain_bytes"`
	}
	enc := func(args ...string) answer {
		t.Helper()
		var a answer
		out := mustRun(t, cmd(append([]string{"map-encoding", "--json"}, args...)...)...)
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		return a
	}
	if a := enc(); a.Encoding != "plain" || a.Changed || a.StoredBytes != a.PlainBytes || a.MapVersion != 1 {
		t.Fatalf("a new cluster: %+v", a)
	}
	if a := enc("gzip"); a.Encoding != "gzip" || !a.Changed || a.MapVersion != 2 || a.StoredBytes >= a.PlainBytes/4 {
		t.Fatalf("switch to gzip: %+v", a)
	}
	if out := mustRun(t, cmd("map-encoding", "gzip")...); !strings.Contains(out, "was already stored gzip") {
		t.Fatalf("second switch: %q", out)
	}
	if a := enc(); a.Encoding != "gzip" || a.MapVersion != 2 {
		t.Fatalf("the second switch wrote: %+v", a)
	}
	if out := mustRun(t, cmd("status")...); !strings.Contains(out, "pg2") {
		t.Fatalf("status of the compressed map: %s", out)
	}
	if r := run(t, "", cmd("map-encoding", "zstd")...); r.code != 2 || !strings.Contains(r.stderr, `"zstd" is not one of plain, gzip`) {
		t.Fatalf("unknown encoding: exit %d %s", r.code, r.stderr)
	}
	if a := enc("plain"); a.Encoding != "plain" || !a.Changed || a.MapVersion != 3 || a.StoredBytes != a.PlainBytes {
		t.Fatalf("switch back: %+v", a)
	}
}
