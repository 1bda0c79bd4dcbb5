package promtest

import (
	"strings"
	"testing"
)

const dashboard = `{
  "title": "shardvisor",
  "annotations": {"list": [{"name": "Moves", "datasource": "${datasource}", "expr": "changes(shardvisor_router_map_version[$__interval]) > 0"}]},
  "templating": {"list": [
    {"name": "datasource", "type": "datasource", "query": "prometheus"},
    {"name": "node", "type": "query", "query": {"query": "label_values(shardvisor_router_pooler_up, node)", "refId": "v"},
     "multi": true, "includeAll": true, "allValue": ".+", "current": {"text": "All", "value": ["$__all"]}},
    {"name": "job", "type": "custom", "query": "shardvisor-router,shardvisor-supervisor", "current": {"value": "shardvisor-router"},
     "definition": "ignored"},
    {"name": "group", "type": "query", "definition": "label_values(node)", "query": ""}
  ]},
  "panels": [
    {"type": "row", "title": "Fleet", "collapsed": false, "panels": []},
    {"type": "timeseries", "title": "Map version", "targets": [
      {"refId": "A", "expr": "max by (job) (shardvisor_router_map_version{job=\"$job\"})"},
      {"refId": "B", "expr": "sum(rate(shardvisor_router_lookups_total[$__rate_interval]))", "hide": true}]},
    {"type": "row", "title": "Groups", "collapsed": true, "panels": [
      {"type": "stat", "title": "Members", "targets": [{"refId": "A", "expr": "shardvisor_router_pooler_up{node=~\"${node:regex}\"}"}]},
      {"type": "text", "title": "Help", "options": {"content": "no query"}}
    ]}
  ]
}`

func TestDashboardQueries(t *testing.T) {
	qs, err := DashboardQueries([]byte(dashboard))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, q := range qs {
		got = append(got, q.String()+": "+q.Expr)
	}
	want := []string{
		"annotation Moves: changes(shardvisor_router_map_version[$__interval]) > 0",
		`Fleet / Map version [A]: max by (job) (shardvisor_router_map_version{job="$job"})`,
		"Fleet / Map version [B]: sum(rate(shardvisor_router_lookups_total[$__rate_interval]))",
		`Groups / Members [A]: shardvisor_router_pooler_up{node=~"${node:regex}"}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("queries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestDashboardVariables(t *testing.T) {
	vs, err := DashboardVariables([]byte(dashboard))
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 4 {
		t.Fatalf("%+v", vs)
	}
	node, job, group := vs[1], vs[2], vs[3]
	if node.Query != "label_values(shardvisor_router_pooler_up, node)" || !node.Multi || !node.IncludeAll || node.AllValue != ".+" ||
		strings.Join(node.Current, ",") != "$__all" {
		t.Fatalf("node: %+v", node)
	}
	if job.Type != "custom" || job.Query != "shardvisor-router,shardvisor-supervisor" || strings.Join(job.Current, ",") != "shardvisor-router" {
		t.Fatalf("job: %+v", job)
	}
	if group.Query != "label_values(node)" {
		t.Fatalf("group: %+v", group)
	}
	for q, want := range map[string][2]string{
		"label_values(shardvisor_router_pooler_up, node)": {"shardvisor_router_pooler_up", "node"},
		"label_values(up{job=~\"a|b\"},instance)":         {`up{job=~"a|b"}`, "instance"},
		" label_values( node ) ":                          {"", "node"},
		"label_values(max by (a, b) (x), b)":              {"max by (a, b) (x)", "b"},
		"query_result(up)":                                {"-", "-"},
		"label_values(x, 1node)":                          {"-", "-"},
	} {
		m, l, ok := LabelValuesQuery(q)
		if want[0] == "-" {
			if ok {
				t.Errorf("%q: taken as label_values(%q, %q)", q, m, l)
			}
			continue
		}
		if !ok || m != want[0] || l != want[1] {
			t.Errorf("%q: (%q, %q, %v), want %q", q, m, l, ok, want)
		}
	}
}

func TestFormat(t *testing.T) {
	all := Variable{Name: "node", Multi: true, IncludeAll: true, AllValue: ".+"}
	noAll := Variable{Name: "node", Multi: true, IncludeAll: true}
	single := Variable{Name: "job"}
	for _, c := range []struct {
		v      Variable
		values []string
		all    bool
		want   string
	}{
		{all, []string{"pg1", "pg5"}, true, ".+"},
		{noAll, []string{"pg1", "pg5.x"}, true, `(pg1|pg5\.x)`},
		{noAll, []string{"pg1"}, false, "pg1"},
		{single, []string{"shardvisor-router"}, false, "shardvisor-router"},
	} {
		if got := c.v.Format(c.values, c.all); got != c.want {
			t.Errorf("%+v %v %v: %q, want %q", c.v, c.values, c.all, got, c.want)
		}
	}
}

func TestExpand(t *testing.T) {
	vars := Builtins(300, 5, 1)
	vars["node"] = ".+"
	vars["job"] = "shardvisor-router"
	for in, want := range map[string]string{
		"sum(rate(x[$__rate_interval]))":         "sum(rate(x[6s]))",
		"increase(x[$__range]) / $__range_s":     "increase(x[300s]) / 300",
		`x{node=~"${node:regex}",job="[[job]]"}`: `x{node=~".+",job="shardvisor-router"}`,
		`x{node=~"$node"} offset $__interval`:    `x{node=~".+"} offset 5s`,
		"no variables":                           "no variables",
	} {
		got, err := Expand(in, vars)
		if err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	if got := Builtins(300, 1, 15)["__rate_interval"]; got != "60s" {
		t.Errorf("$__rate_interval at 15 s scrapes, 1 s step: %s, want 60s (four scrapes)", got)
	}
	if got := Builtins(300, 60, 15)["__rate_interval"]; got != "75s" {
		t.Errorf("$__rate_interval at 15 s scrapes, 60 s step: %s, want 75s (step + scrape)", got)
	}
	if _, err := Expand(`x{a="$nodes", b="$__rate"}`, vars); err == nil || !strings.Contains(err.Error(), "$nodes, $__rate") {
		t.Errorf("unknown variables: %v", err)
	}
}
