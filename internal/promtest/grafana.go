package promtest

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// PanelQuery is one query of a Grafana dashboard: a panel target's expr.
type PanelQuery struct {
	Panel string // the panel's title (its row's before it, "row / panel")
	RefID string
	Expr  string
}

func (q PanelQuery) String() string {
	if q.RefID == "" {
		return q.Panel
	}
	return q.Panel + " [" + q.RefID + "]"
}

// DashboardQueries returns every expr of dashboard (Grafana's JSON model):
// every panel's targets, named "row / panel" (a row's panels follow it,
// or sit in it when it is collapsed), and the annotations' queries.
// Hidden targets count too: an operator can unhide them.
func DashboardQueries(dashboard []byte) ([]PanelQuery, error) {
	var d struct {
		Panels      []gPanel `json:"panels"`
		Annotations struct {
			List []struct {
				Name string `json:"name"`
				Expr string `json:"expr"`
			} `json:"list"`
		} `json:"annotations"`
	}
	if err := json.Unmarshal(dashboard, &d); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	var out []PanelQuery
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			out = append(out, PanelQuery{Panel: "annotation " + a.Name, Expr: a.Expr})
		}
	}
	var walk func(ps []gPanel, row string)
	walk = func(ps []gPanel, row string) {
		for _, p := range ps {
			if p.Type == "row" {
				row = p.Title
				walk(p.Panels, row)
				continue
			}
			name := p.Title
			if row != "" {
				name = row + " / " + p.Title
			}
			for _, t := range p.Targets {
				if t.Expr != "" {
					out = append(out, PanelQuery{Panel: name, RefID: t.RefID, Expr: t.Expr})
				}
			}
			walk(p.Panels, row)
		}
	}
	walk(d.Panels, "")
	return out, nil
}

// gPanel is a dashboard panel, a row included.
type gPanel struct {
	Type    string   `json:"type"`
	Title   string   `json:"title"`
	Panels  []gPanel `json:"panels"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// Variable is a dashboard variable (templating.list) as far as a test
// needs it to expand queries.
type Variable struct {
	Name       string
	Type       string // query, custom, interval, constant, textbox, datasource...
	Query      string // a query variable's label_values(...), a custom one's values
	Multi      bool
	IncludeAll bool
	AllValue   string
	Current    []string // the saved selection
}

// DashboardVariables returns dashboard's variables.
func DashboardVariables(dashboard []byte) ([]Variable, error) {
	var d struct {
		Templating struct {
			List []struct {
				Name       string          `json:"name"`
				Type       string          `json:"type"`
				Query      json.RawMessage `json:"query"`
				Definition string          `json:"definition"`
				Multi      bool            `json:"multi"`
				IncludeAll bool            `json:"includeAll"`
				AllValue   *string         `json:"allValue"`
				Current    struct {
					Value json.RawMessage `json:"value"`
				} `json:"current"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(dashboard, &d); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	var out []Variable
	for _, v := range d.Templating.List {
		nv := Variable{Name: v.Name, Type: v.Type, Multi: v.Multi, IncludeAll: v.IncludeAll}
		if v.AllValue != nil {
			nv.AllValue = *v.AllValue
		}
		// A query is a string, or (newer Grafana) {"query": "...", ...}.
		var s string
		var obj struct {
			Query string `json:"query"`
		}
		switch {
		case len(v.Query) == 0:
		case json.Unmarshal(v.Query, &s) == nil:
			nv.Query = s
		case json.Unmarshal(v.Query, &obj) == nil:
			nv.Query = obj.Query
		}
		if nv.Query == "" {
			nv.Query = v.Definition
		}
		var one string
		var many []string
		switch {
		case len(v.Current.Value) == 0:
		case json.Unmarshal(v.Current.Value, &one) == nil:
			nv.Current = []string{one}
		case json.Unmarshal(v.Current.Value, &many) == nil:
			nv.Current = many
		}
		out = append(out, nv)
	}
	return out, nil
}

var labelValuesCall = regexp.MustCompile(`^\s*label_values\(\s*(?:(.*?)\s*,\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$`)

// LabelValuesQuery splits a query variable's label_values(METRIC, LABEL)
// or label_values(LABEL): match is "" for the latter.
func LabelValuesQuery(q string) (match, label string, ok bool) {
	m := labelValuesCall.FindStringSubmatch(q)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// Format is the value a variable takes in a Prometheus query when values
// are selected, as Grafana writes it: one value as it is; several (a
// multi-value or "All" selection) as a regular expression (a|b), each
// escaped; "All" as the variable's allValue when it has one.
func (v Variable) Format(values []string, all bool) string {
	if all && v.AllValue != "" {
		return v.AllValue
	}
	if len(values) == 1 && !all && !v.Multi {
		return values[0]
	}
	esc := make([]string, len(values))
	for i, s := range values {
		esc[i] = regexp.QuoteMeta(s)
	}
	if len(esc) == 1 {
		return esc[0]
	}
	return "(" + strings.Join(esc, "|") + ")"
}

// variableRef is $name, ${name}, ${name:format} or [[name]].
var variableRef = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[A-Za-z0-9_]+)?\}|\[\[([A-Za-z0-9_]+)\]\]|\$([A-Za-z0-9_]+)`)

// Expand replaces every Grafana variable in expr by its value in vars
// (builtins such as __rate_interval included: the caller gives them). As
// in Grafana, $name takes every word character after the $ ($__rate_interval
// is not $__rate). A variable vars lacks is an error that names it.
func Expand(expr string, vars map[string]string) (string, error) {
	var missing []string
	out := variableRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := variableRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		if v, ok := vars[name]; ok {
			return v
		}
		missing = append(missing, name)
		return ref
	})
	if len(missing) > 0 {
		return out, fmt.Errorf("unknown variable $%s in %q", strings.Join(missing, ", $"), expr)
	}
	return out, nil
}

// Builtins are Grafana's global variables for a query over the last
// rangeSecs seconds, every stepSecs, on a server scraping every
// scrapeSecs: $__rate_interval as Grafana computes it (the larger of the
// step plus one scrape and four scrapes), $__interval (the step), and
// $__range.
func Builtins(rangeSecs, stepSecs, scrapeSecs int) map[string]string {
	rate := max(stepSecs+scrapeSecs, 4*scrapeSecs)
	return map[string]string{
		"__rate_interval": fmt.Sprintf("%ds", rate),
		"__interval":      fmt.Sprintf("%ds", stepSecs),
		"__interval_ms":   fmt.Sprintf("%d", stepSecs*1000),
		"__range":         fmt.Sprintf("%ds", rangeSecs),
		"__range_s":       fmt.Sprintf("%d", rangeSecs),
		"__range_ms":      fmt.Sprintf("%d", rangeSecs*1000),
	}
}
