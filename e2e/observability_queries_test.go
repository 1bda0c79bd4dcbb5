package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/promtest"
)

// query is one query the test checks: a recording rule's series or a
// dashboard panel's expr, expanded.
type query struct {
	what string // "recording rule NAME" or "DASHBOARD: PANEL [REF]"
	expr string
	err  error // the last answer's error, nil once it has data
	// final: asking again will not help (it does not parse, or the test
	// could not fill in its variables).
	final bool
}

var errNoData = errors.New("no data")

// queries checks that every recording rule and every query of every
// dashboard in deploy/grafana parses and has data over the run, as a
// dashboard panel draws it: a range query from Prometheus's start until
// now. A query still without data is asked again until a minute has
// passed (a rate needs two scrapes, a rule an evaluation).
func (o *obs) queries(t *testing.T) {
	ctx := context.Background()
	groups, err := o.prom.Rules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var recs, dash []*query
	alerting := 0
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Type != "recording" {
				alerting++
				if r.Health == "err" {
					t.Errorf("alerting rule %s: its evaluation fails: %s", r.Name, r.LastError)
				}
				continue
			}
			q := &query{what: "recording rule " + r.Name, expr: r.Name}
			if r.Health == "err" {
				q.err = fmt.Errorf("its evaluation fails: %s", r.LastError)
			}
			recs = append(recs, q)
		}
	}
	paths, _ := filepath.Glob(filepath.Join(repoRoot(), "deploy", "grafana", "*.json"))
	if len(paths) == 0 {
		t.Fatalf("no dashboard in %s", filepath.Join(repoRoot(), "deploy", "grafana"))
	}
	for _, p := range paths {
		dash = append(dash, o.dashboardQueries(t, p)...)
	}
	all := append(slices.Clone(recs), dash...)
	step := 5 * time.Second
	ask := func(q *query) {
		r, err := o.prom.QueryRange(ctx, q.expr, o.since, time.Now(), step)
		switch {
		case err != nil:
			q.err, q.final = err, isParseError(err)
		case r.Empty():
			q.err = errNoData
		default:
			q.err = nil
		}
	}
	for _, q := range all {
		if q.err == nil {
			q.err = errNoData // not asked yet
		} else {
			q.final = true
		}
	}
	waitUntil(time.Minute, func() bool {
		left := 0
		for _, q := range all {
			if q.err != nil && !q.final {
				ask(q)
			}
			if q.err != nil && !q.final {
				left++
			}
		}
		return left == 0
	})
	count := func(qs []*query) (ok int, bad []string) {
		for _, q := range qs {
			if q.err == nil {
				ok++
			} else {
				bad = append(bad, fmt.Sprintf("  %s: %v\n    %s", q.what, q.err, q.expr))
			}
		}
		return ok, bad
	}
	rOK, rBad := count(recs)
	dOK, dBad := count(dash)
	t.Logf("recording rules: %d of %d return data; dashboard queries: %d of %d parse and return data; %d alerting rules loaded", rOK, len(recs), dOK, len(dash), alerting)
	o.summary = append(o.summary, fmt.Sprintf("recording rules %d/%d with data, dashboard queries %d/%d with data", rOK, len(recs), dOK, len(dash)))
	if len(rBad)+len(dBad) > 0 {
		t.Errorf("without data after a minute:\n%s", strings.Join(append(rBad, dBad...), "\n"))
	}
}

// isParseError: the server refused the query (bad_data); asking again
// will not help.
func isParseError(err error) bool {
	var ae *promtest.APIError
	return errors.As(err, &ae) && ae.ErrorType == "bad_data"
}

// dashboardQueries are a dashboard's queries with its variables filled in
// as Grafana would (dashboardVars); a query the test cannot expand is
// reported as such.
func (o *obs) dashboardQueries(t *testing.T, path string) []*query {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := promtest.DashboardQueries(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	vars, err := promtest.DashboardVariables(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	values := o.dashboardVars(t, filepath.Base(path), vars)
	var out []*query
	for _, pq := range qs {
		q := &query{what: filepath.Base(path) + ": " + pq.String()}
		if q.expr, q.err = promtest.Expand(pq.Expr, values); q.err != nil {
			q.expr = pq.Expr // reported as it stands
		}
		out = append(out, q)
	}
	return out
}

// dashboardVars gives every variable of a dashboard the value Grafana
// would on opening it: a query variable's values from the server
// (label_values), all of them when it includes All and All is its
// selection, else its selected value or the first; a custom or interval
// variable its selection or first option; and Grafana's builtins for a
// range from Prometheus's start until now, every 5 s.
func (o *obs) dashboardVars(t *testing.T, dash string, vars []promtest.Variable) map[string]string {
	ctx := context.Background()
	rangeSecs := int(time.Since(o.since).Seconds()) + 1
	out := promtest.Builtins(rangeSecs, 5, 1)
	for _, v := range vars {
		switch v.Type {
		case "datasource":
			out[v.Name] = "prometheus"
		case "query":
			match, label, ok := promtest.LabelValuesQuery(v.Query)
			if !ok {
				t.Errorf("%s: variable %s: %q is not label_values(...); the test cannot fill it in", dash, v.Name, v.Query)
				continue
			}
			var ms []string
			if match != "" {
				m, err := promtest.Expand(match, out)
				if err != nil {
					t.Errorf("%s: variable %s: %v", dash, v.Name, err)
					continue
				}
				ms = []string{m}
			}
			var vals []string
			var err error
			waitUntil(time.Minute, func() bool {
				vals, err = o.prom.LabelValues(ctx, label, ms...)
				return err == nil && len(vals) > 0
			})
			if len(vals) == 0 {
				t.Errorf("%s: variable %s: no values of %s (%v)", dash, v.Name, v.Query, err)
				continue
			}
			all := v.IncludeAll && (len(v.Current) == 0 || slices.Contains(v.Current, "$__all") || slices.Contains(v.Current, "All"))
			if !all {
				pick := vals[0]
				for _, c := range v.Current {
					if slices.Contains(vals, c) {
						pick = c
						break
					}
				}
				vals = []string{pick}
			}
			out[v.Name] = v.Format(vals, all)
		case "custom", "interval":
			var opts []string
			for _, s := range strings.Split(v.Query, ",") {
				if s = strings.TrimSpace(s); s != "" {
					opts = append(opts, s)
				}
			}
			pick := ""
			if len(opts) > 0 {
				pick = opts[0]
			}
			if len(v.Current) > 0 && v.Current[0] != "$__all" {
				pick = v.Current[0]
			}
			out[v.Name] = pick
		default: // constant, textbox
			out[v.Name] = v.Query
			if len(v.Current) > 0 {
				out[v.Name] = v.Current[0]
			}
		}
		t.Logf("%s: $%s = %s", dash, v.Name, out[v.Name])
	}
	return out
}
