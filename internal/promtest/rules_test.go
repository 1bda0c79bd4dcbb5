package promtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const ruleFile = `# a comment: for: 10m is not a key
groups:
- name: shardvisor-moves
  interval: 30s
  rules:
  - alert: ShardvisorBucketFrozen
    # the pause cap plus the watcher's bound
    expr: max(shardvisor_move_frozen_bucket_oldest_seconds) > 2
    for: 15s
    labels: {severity: page}
  - record: shardvisor:moves:rate5m
    expr: sum(rate(shardvisor_move_stragglers_total[5m]))
  - expr: absent(shardvisor_move_frozen_bucket_oldest_seconds)
    for: "5m"   # the key before the name
    alert: ShardvisorNoMoveRunner
    annotations:
      summary: "for: 1h in a string is no key"
- name: 'shardvisor-groups'
  rules:
    - alert: ShardvisorGroupMemberMissing
      expr: shardvisor_router_patroni_group_members < shardvisor_router_patroni_group_members_expected
      for: 1m
    - alert: Fast
      expr: vector(1)
      for: 2s
  interval: 1h30m
`

func TestShorten(t *testing.T) {
	out, rw, err := Shorten("r.yml", []byte(ruleFile), 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rw {
		got = append(got, r.String())
	}
	want := []string{
		"r.yml: group shardvisor-moves interval: 30s -> 3s",
		"r.yml: ShardvisorBucketFrozen for: 15s -> 3s",
		"r.yml: ShardvisorNoMoveRunner for: 5m -> 3s",
		"r.yml: ShardvisorGroupMemberMissing for: 1m -> 3s",
		"r.yml: group shardvisor-groups interval: 1h30m -> 3s",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("rewrites:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if rw[0].Line != 4 || rw[2].Line != 14 {
		t.Fatalf("lines %d, %d; want 4, 14", rw[0].Line, rw[2].Line)
	}
	// Only the durations changed, quotes and comments kept.
	wantText := strings.NewReplacer(
		"  interval: 30s\n", "  interval: 3s\n",
		"    for: 15s\n", "    for: 3s\n",
		`for: "5m"   # the key`, `for: "3s"   # the key`,
		"      for: 1m\n", "      for: 3s\n",
		"  interval: 1h30m\n", "  interval: 3s\n",
	).Replace(ruleFile)
	if string(out) != wantText {
		t.Fatalf("rewritten file:\n%s\nwant:\n%s", out, wantText)
	}
}

func TestShortenNothingToDo(t *testing.T) {
	out, rw, err := Shorten("r.yml", []byte(ruleFile), 0)
	if err != nil || len(rw) != 0 || string(out) != ruleFile {
		t.Fatalf("limit 0 changed the file: %v %v", rw, err)
	}
	out, rw, err = Shorten("r.yml", []byte(ruleFile), 2*time.Hour)
	if err != nil || len(rw) != 0 || string(out) != ruleFile {
		t.Fatalf("a limit above every duration changed the file: %v %v", rw, err)
	}
}

func TestShortenRefusesWhatItCannotRead(t *testing.T) {
	for _, src := range []string{
		"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n    for: soon\n",
		"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n    for: 5x\n",
	} {
		if _, _, err := Shorten("r.yml", []byte(src), time.Second); err == nil || !strings.Contains(err.Error(), "r.yml:6: for") {
			t.Errorf("%q: err = %v, want one naming r.yml:6", src, err)
		}
	}
}

func TestShortenKeepsCRLF(t *testing.T) {
	src := "groups:\r\n- name: g\r\n  rules:\r\n  - alert: A\r\n    expr: up\r\n    for: 10m\r\n"
	out, rw, err := Shorten("r.yml", []byte(src), time.Minute)
	if err != nil || len(rw) != 1 {
		t.Fatal(rw, err)
	}
	if want := strings.Replace(src, "10m", "1m", 1); string(out) != want {
		t.Fatalf("%q, want %q", out, want)
	}
}

// The shipped rule files shortened as the observability test loads them:
// every rewrite is named by its alert, and promtool finds the copies
// valid.
func TestShortenShippedRules(t *testing.T) {
	paths, _ := filepath.Glob("../../deploy/prometheus/*.yml")
	dir := t.TempDir()
	n := 0
	for _, p := range paths {
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(src), "\ngroups:") && !strings.HasPrefix(string(src), "groups:") {
			continue // prometheus.example.yml
		}
		out, rw, err := Shorten(filepath.Base(p), src, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rw {
			if r.Rule == "" || strings.HasPrefix(r.Rule, "group ") != (r.Key == "interval") {
				t.Errorf("%s: rewrite not named by its rule: %+v", p, r)
			}
		}
		n += len(rw)
		dst := filepath.Join(dir, filepath.Base(p))
		if err := os.WriteFile(dst, out, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("promtool", "check", "rules", dst).CombinedOutput(); err != nil {
			t.Errorf("promtool check rules on the shortened %s: %v\n%s", filepath.Base(p), err, out)
		}
	}
	if n == 0 {
		t.Fatal("no for: to shorten in deploy/prometheus: are the rule files there?")
	}
}
