package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const (
	rulesFile     = "prometheus/shardvisor.rules.yml"
	recordingFile = "prometheus/shardvisor.recording.yml"
	exampleFile   = "prometheus/prometheus.example.yml"
	dashboardFile = "grafana/shardvisor.json"
	runbookBase   = "https://github.com/shardvisor/shardvisor/blob/main/docs/operations.md#"
)

// jobs are the scrape jobs the rules may name (prometheus.example.yml's).
var jobs = []string{"shardvisor-supervisor", "shardvisor-router", "shardvisor-watchers"}

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

func (f *ruleFile) rules() []rule {
	var out []rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// unitTest is a promtool test file, as far as this test reads it.
type unitTest struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name          string `yaml:"name"`
		AlertRuleTest []struct {
			EvalTime  string           `yaml:"eval_time"`
			AlertName string           `yaml:"alertname"`
			ExpAlerts []map[string]any `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// decode reads a YAML file into v (the fields this test reads; promtool
// reads the files strictly: make check-rules).
func decode(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func load(t *testing.T, path string) []rule {
	t.Helper()
	var f ruleFile
	decode(t, path, &f)
	return f.rules()
}

// Every alert is named Shardvisor..., has a severity of page or ticket,
// a summary, a description and a runbook_url pointing at its section of
// docs/operations.md, and names only the example's scrape jobs; the
// alerts other tests and docs rely on exist.
func TestAlertRules(t *testing.T) {
	alerts := load(t, rulesFile)
	seen := map[string]bool{}
	jobRE := regexp.MustCompile(`job\s*=~?\s*"([^"]*)"`)
	for _, a := range alerts {
		if a.Alert == "" {
			t.Errorf("%s: a rule that is not an alert (record %q): recording rules go to %s", rulesFile, a.Record, recordingFile)
			continue
		}
		if seen[a.Alert] {
			t.Errorf("alert %s defined twice", a.Alert)
		}
		seen[a.Alert] = true
		if !strings.HasPrefix(a.Alert, "Shardvisor") {
			t.Errorf("alert %s: not named Shardvisor...", a.Alert)
		}
		if s := a.Labels["severity"]; s != "page" && s != "ticket" {
			t.Errorf("alert %s: severity %q, want page or ticket", a.Alert, s)
		}
		for _, k := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(a.Annotations[k]) == "" {
				t.Errorf("alert %s: no %s", a.Alert, k)
			}
		}
		if want := runbookBase + strings.ToLower(a.Alert); a.Annotations["runbook_url"] != want {
			t.Errorf("alert %s: runbook_url %q, want %q", a.Alert, a.Annotations["runbook_url"], want)
		}
		if !strings.Contains(a.Annotations["description"], "shardctl") && !strings.Contains(a.Annotations["description"], "systemctl") {
			t.Errorf("alert %s: its description names no first step to run (a shardctl or systemctl command)", a.Alert)
		}
		for _, m := range jobRE.FindAllStringSubmatch(a.Expr, -1) {
			if !slices.Contains(jobs, m[1]) {
				t.Errorf("alert %s: job %q is none of the example's scrape jobs %v", a.Alert, m[1], jobs)
			}
		}
	}
	for _, name := range []string{"ShardvisorBucketFrozen", "ShardvisorGroupMemberMissing", "ShardvisorGroupNoSyncStandby", "ShardvisorGroupNoLeader",
		"ShardvisorFlipOutcomeUnknown", "ShardvisorNoMoveRunner", "ShardvisorMoveWayBackLost", "ShardvisorMoveWayBackNotRunning", "ShardvisorMoveStuck",
		"ShardvisorMoveStragglers", "ShardvisorSupervisorFailStatic", "ShardvisorConfigRefused", "ShardvisorReverseSlotHoldingWAL",
		"ShardvisorSchemaDrift", "ShardvisorSchemaChangePartial", "ShardvisorGCBlocked"} {
		if !seen[name] {
			t.Errorf("alert %s is missing", name)
		}
	}
}

// Every alert has a unit test in prometheus/tests that fires it (a
// non-empty exp_alerts) and one that checks it does not fire (empty),
// and every test file loads rule files that exist.
func TestEveryAlertHasUnitTests(t *testing.T) {
	files, err := filepath.Glob("prometheus/tests/*.test.yml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no unit test files (%v)", err)
	}
	fires, quiet := map[string]int{}, map[string]int{}
	for _, path := range files {
		var u unitTest
		decode(t, path, &u)
		if len(u.RuleFiles) == 0 {
			t.Errorf("%s loads no rule file", path)
		}
		for _, rf := range u.RuleFiles {
			if _, err := os.Stat(filepath.Join(filepath.Dir(path), rf)); err != nil {
				t.Errorf("%s: rule file %s: %v", path, rf, err)
			}
		}
		for _, tc := range u.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.AlertName]++
				} else {
					quiet[a.AlertName]++
				}
			}
		}
	}
	known := map[string]bool{}
	for _, a := range load(t, rulesFile) {
		known[a.Alert] = true
		if fires[a.Alert] == 0 {
			t.Errorf("alert %s: no unit test fires it (an alert_rule_test with a non-empty exp_alerts)", a.Alert)
		}
		if quiet[a.Alert] == 0 {
			t.Errorf("alert %s: no unit test checks that it does not fire (below its threshold, or before its for: elapses)", a.Alert)
		}
	}
	for name := range fires {
		if !known[name] {
			t.Errorf("a unit test expects alert %s, which no rule defines", name)
		}
	}
}

// Recording rules are named shardvisor:<what>:<op>, once each, and each is
// used by the dashboard or by another rule.
func TestRecordingRulesAreUsed(t *testing.T) {
	recs := load(t, recordingFile)
	nameRE := regexp.MustCompile(`^shardvisor:[a-z0-9_]+:[a-z0-9_]+$`)
	alerts := load(t, rulesFile)
	var exprs []string
	for _, r := range append(alerts, recs...) {
		exprs = append(exprs, r.Expr)
	}
	dash := dashboardExprs(t)
	seen := map[string]bool{}
	for i, r := range recs {
		if r.Record == "" {
			t.Errorf("%s: rule %d is not a recording rule (alert %q)", recordingFile, i, r.Alert)
			continue
		}
		if !nameRE.MatchString(r.Record) {
			t.Errorf("recording rule %s: not named shardvisor:<what>:<op>", r.Record)
		}
		if seen[r.Record] {
			t.Errorf("recording rule %s defined twice", r.Record)
		}
		seen[r.Record] = true
		uses := usesName(r.Record)
		used := false
		for j, e := range exprs {
			if j != len(alerts)+i && uses(e) { // not its own
				used = true
			}
		}
		for _, e := range dash {
			used = used || uses(e)
		}
		if !used {
			t.Errorf("recording rule %s: used by neither the dashboard nor another rule", r.Record)
		}
	}
}

// usesName returns whether a PromQL expression names the series name
// (not as a prefix of a longer one).
func usesName(name string) func(expr string) bool {
	return regexp.MustCompile(regexp.QuoteMeta(name) + `($|[^a-zA-Z0-9_:])`).MatchString
}

type dashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	SchemaVersion int     `json:"schemaVersion"`
	UID           string  `json:"uid"`
	Panels        []panel `json:"panels"`
}

type panel struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// dashboardExprs is every query of the dashboard's panels.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	var out []string
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(readDashboard(t).Panels)
	return out
}

// The dashboard takes its Prometheus as the input DS_PROMETHEUS, has the
// rows an operator looks for, and every panel queries recording rules
// that exist (so that a panel shows what the rules file defines).
func TestDashboard(t *testing.T) {
	d := readDashboard(t)
	if len(d.Inputs) != 1 || d.Inputs[0].Name != "DS_PROMETHEUS" || d.Inputs[0].PluginID != "prometheus" {
		t.Errorf("__inputs %+v, want one prometheus input DS_PROMETHEUS", d.Inputs)
	}
	if d.SchemaVersion < 36 || d.UID == "" {
		t.Errorf("schemaVersion %d, uid %q", d.SchemaVersion, d.UID)
	}
	recorded := map[string]bool{}
	for _, r := range load(t, recordingFile) {
		recorded[r.Record] = true
	}
	nameRE := regexp.MustCompile(`shardvisor:[a-zA-Z0-9_:]+`)
	var rows []string
	queries := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			rows = append(rows, p.Title)
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${DS_PROMETHEUS}" {
			t.Errorf("panel %q: datasource %+v, want uid ${DS_PROMETHEUS}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			names := nameRE.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q uses no recording rule", p.Title, tg.Expr)
			}
			for _, n := range names {
				if !recorded[n] {
					t.Errorf("panel %q: query %q: no recording rule %s", p.Title, tg.Expr, n)
				}
			}
		}
	}
	for _, want := range []string{"Fleet", "Moves", "Patroni groups", "Poolers", "GC", "Schema", "Backups"} {
		if !slices.Contains(rows, want) {
			t.Errorf("no row %q (rows: %v)", want, rows)
		}
	}
	if queries < 20 {
		t.Errorf("%d queries", queries)
	}
}

// Every dashboard query parses: each goes into a rules file as a recording
// rule, which promtool checks (promtool query needs a server).
func TestDashboardQueriesParse(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian: prometheus; scripts/install-deps installs it): the dashboard's queries are not parsed")
	}
	var b strings.Builder
	b.WriteString("groups:\n- name: dashboard\n  rules:\n")
	for i, e := range dashboardExprs(t) {
		q, _ := json.Marshal(e) // a JSON string is a YAML string
		fmt.Fprintf(&b, "  - record: dashboard_query_%d\n    expr: %s\n", i, q)
	}
	path := filepath.Join(t.TempDir(), "dashboard.rules.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}

// The example configuration scrapes the jobs the rules name and loads both
// rule files.
func TestExampleConfig(t *testing.T) {
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName string `yaml:"job_name"`
		} `yaml:"scrape_configs"`
	}
	decode(t, exampleFile, &cfg)
	var names []string
	for _, s := range cfg.ScrapeConfigs {
		names = append(names, s.JobName)
	}
	if !slices.Equal(names, jobs) {
		t.Errorf("scrape jobs %v, want %v", names, jobs)
	}
	if !slices.Equal(cfg.RuleFiles, []string{filepath.Base(rulesFile), filepath.Base(recordingFile)}) {
		t.Errorf("rule_files %v", cfg.RuleFiles)
	}
}
