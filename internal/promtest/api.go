package promtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Client asks a Prometheus server's HTTP API (v1), with typed answers.
type Client struct {
	// URL is the server's base URL, http://127.0.0.1:PORT.
	URL  string
	HTTP *http.Client
}

// APIError is an answer with status "error": a query that does not parse
// is ErrorType "bad_data".
type APIError struct {
	Path      string
	Code      int // HTTP status
	ErrorType string
	Err       string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("prometheus %s: %d %s: %s", e.Path, e.Code, e.ErrorType, e.Err)
}

// envelope is every answer of the API.
type envelope struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Warnings  []string        `json:"warnings"`
}

// get asks path with query parameters q and decodes the answer's data
// into data.
func (c *Client) get(ctx context.Context, path string, q url.Values, data any) error {
	u := c.URL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	res, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return err
	}
	return decode(path, res.StatusCode, body, data)
}

// decode reads an answer of the API (pure, for the unit tests).
func decode(path string, code int, body []byte, data any) error {
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("prometheus %s: %d: not an API answer: %w (%.200q)", path, code, err, body)
	}
	if env.Status != "success" {
		return &APIError{Path: path, Code: code, ErrorType: env.ErrorType, Err: env.Error}
	}
	if err := json.Unmarshal(env.Data, data); err != nil {
		return fmt.Errorf("prometheus %s: data: %w", path, err)
	}
	return nil
}

// Sample is one value of an instant vector, or a scalar (no labels).
type Sample struct {
	Metric map[string]string
	Time   time.Time
	Value  float64
}

// Series is one series of a range vector (matrix).
type Series struct {
	Metric map[string]string
	Points []Sample // without Metric
}

// Result is a query's answer: Type is vector, matrix, scalar or string.
type Result struct {
	Type   string
	Vector []Sample
	Matrix []Series
	Scalar *Sample
	String string
}

// Empty reports whether the result holds no data: an empty vector or
// matrix. A scalar or a string is never empty.
func (r Result) Empty() bool {
	switch r.Type {
	case "vector":
		return len(r.Vector) == 0
	case "matrix":
		return len(r.Matrix) == 0
	default:
		return false
	}
}

// Len is the number of series (1 for a scalar or a string).
func (r Result) Len() int {
	switch r.Type {
	case "vector":
		return len(r.Vector)
	case "matrix":
		return len(r.Matrix)
	default:
		return 1
	}
}

// point is [unix seconds, "value"].
type point [2]json.RawMessage

func (p point) sample() (Sample, error) {
	var ts float64
	if err := json.Unmarshal(p[0], &ts); err != nil {
		return Sample{}, fmt.Errorf("timestamp %s: %w", p[0], err)
	}
	var v string
	if err := json.Unmarshal(p[1], &v); err != nil {
		return Sample{}, fmt.Errorf("value %s: %w", p[1], err)
	}
	f, err := strconv.ParseFloat(v, 64) // NaN, +Inf and -Inf included
	if err != nil {
		return Sample{}, fmt.Errorf("value %q: %w", v, err)
	}
	sec, frac := math.Modf(ts)
	return Sample{Time: time.Unix(int64(sec), int64(math.Round(frac*1e3))*1e6), Value: f}, nil
}

// parseResult reads the data of /api/v1/query and /api/v1/query_range.
func parseResult(raw json.RawMessage) (Result, error) {
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return Result{}, err
	}
	r := Result{Type: d.ResultType}
	switch d.ResultType {
	case "vector":
		var v []struct {
			Metric map[string]string `json:"metric"`
			Value  point             `json:"value"`
		}
		if err := json.Unmarshal(d.Result, &v); err != nil {
			return r, err
		}
		for _, e := range v {
			s, err := e.Value.sample()
			if err != nil {
				return r, err
			}
			s.Metric = e.Metric
			r.Vector = append(r.Vector, s)
		}
	case "matrix":
		var m []struct {
			Metric map[string]string `json:"metric"`
			Values []point           `json:"values"`
		}
		if err := json.Unmarshal(d.Result, &m); err != nil {
			return r, err
		}
		for _, e := range m {
			ser := Series{Metric: e.Metric}
			for _, p := range e.Values {
				s, err := p.sample()
				if err != nil {
					return r, err
				}
				ser.Points = append(ser.Points, s)
			}
			r.Matrix = append(r.Matrix, ser)
		}
	case "scalar":
		var p point
		if err := json.Unmarshal(d.Result, &p); err != nil {
			return r, err
		}
		s, err := p.sample()
		if err != nil {
			return r, err
		}
		r.Scalar = &s
	case "string":
		var p [2]json.RawMessage
		if err := json.Unmarshal(d.Result, &p); err != nil {
			return r, err
		}
		if err := json.Unmarshal(p[1], &r.String); err != nil {
			return r, err
		}
	default:
		return r, fmt.Errorf("result type %q", d.ResultType)
	}
	return r, nil
}

// Query evaluates q at the server's now (/api/v1/query).
func (c *Client) Query(ctx context.Context, q string) (Result, error) {
	var raw json.RawMessage
	if err := c.get(ctx, "/api/v1/query", url.Values{"query": {q}}, &raw); err != nil {
		return Result{}, err
	}
	r, err := parseResult(raw)
	if err != nil {
		return r, fmt.Errorf("prometheus query %q: %w", q, err)
	}
	return r, nil
}

// QueryRange evaluates q over [start, end] every step, as a dashboard
// panel does (/api/v1/query_range).
func (c *Client) QueryRange(ctx context.Context, q string, start, end time.Time, step time.Duration) (Result, error) {
	var raw json.RawMessage
	v := url.Values{"query": {q}, "start": {unix(start)}, "end": {unix(end)}, "step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}
	if err := c.get(ctx, "/api/v1/query_range", v, &raw); err != nil {
		return Result{}, err
	}
	r, err := parseResult(raw)
	if err != nil {
		return r, fmt.Errorf("prometheus query_range %q: %w", q, err)
	}
	return r, nil
}

func unix(t time.Time) string { return strconv.FormatFloat(float64(t.UnixMilli())/1e3, 'f', 3, 64) }

// LabelValues returns the values of label name on the series matching
// match (none: all series), as Grafana's label_values() asks.
func (c *Client) LabelValues(ctx context.Context, name string, match ...string) ([]string, error) {
	var out []string
	v := url.Values{}
	for _, m := range match {
		v.Add("match[]", m)
	}
	err := c.get(ctx, "/api/v1/label/"+url.PathEscape(name)+"/values", v, &out)
	return out, err
}

// Alert is an active alert (pending or firing), of /api/v1/alerts or of a
// rule of /api/v1/rules.
type Alert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"` // "pending" or "firing"
	ActiveAt    time.Time         `json:"activeAt"`
	Value       string            `json:"value"`
}

// Name is the alert's alertname.
func (a Alert) Name() string { return a.Labels["alertname"] }

// Rule is a recording or alerting rule as the server evaluates it.
type Rule struct {
	Type           string            `json:"type"` // "recording" or "alerting"
	Name           string            `json:"name"`
	Query          string            `json:"query"`
	Labels         map[string]string `json:"labels"`
	Annotations    map[string]string `json:"annotations"`
	Health         string            `json:"health"` // "ok", "err", "unknown"
	LastError      string            `json:"lastError"`
	State          string            `json:"state"` // alerting: "inactive", "pending", "firing"
	Alerts         []Alert           `json:"alerts"`
	LastEvaluation time.Time         `json:"lastEvaluation"`
	// DurationSeconds is an alerting rule's `for:`.
	DurationSeconds float64 `json:"duration"`
}

// For is an alerting rule's `for:` as the server loaded it.
func (r Rule) For() time.Duration { return time.Duration(r.DurationSeconds * float64(time.Second)) }

// RuleGroup is a group of rules of one file.
type RuleGroup struct {
	Name            string    `json:"name"`
	File            string    `json:"file"`
	Rules           []Rule    `json:"rules"`
	IntervalSeconds float64   `json:"interval"`
	LastEvaluation  time.Time `json:"lastEvaluation"`
}

// Rules returns every rule group the server has loaded (/api/v1/rules).
func (c *Client) Rules(ctx context.Context) ([]RuleGroup, error) {
	var d struct {
		Groups []RuleGroup `json:"groups"`
	}
	err := c.get(ctx, "/api/v1/rules", nil, &d)
	return d.Groups, err
}

// Alerts returns the active alerts (/api/v1/alerts).
func (c *Client) Alerts(ctx context.Context) ([]Alert, error) {
	var d struct {
		Alerts []Alert `json:"alerts"`
	}
	err := c.get(ctx, "/api/v1/alerts", nil, &d)
	return d.Alerts, err
}

// AlertState is the state of alert name among alerts: "firing" if any of
// its instances fires, else "pending" if one is pending, else
// "inactive"; and the instance that decided it.
func AlertState(alerts []Alert, name string) (string, Alert) {
	state, which := "inactive", Alert{}
	for _, a := range alerts {
		if a.Name() != name {
			continue
		}
		switch {
		case a.State == "firing":
			return "firing", a
		case a.State == "pending" && state == "inactive":
			state, which = "pending", a
		}
	}
	return state, which
}

// Target is a scrape target (/api/v1/targets, active ones).
type Target struct {
	ScrapePool string            `json:"scrapePool"` // the job
	ScrapeURL  string            `json:"scrapeUrl"`
	Labels     map[string]string `json:"labels"`
	Health     string            `json:"health"` // "up", "down", "unknown"
	LastError  string            `json:"lastError"`
	LastScrape time.Time         `json:"lastScrape"`
}

// Targets returns the active scrape targets.
func (c *Client) Targets(ctx context.Context) ([]Target, error) {
	var d struct {
		ActiveTargets []Target `json:"activeTargets"`
	}
	err := c.get(ctx, "/api/v1/targets", url.Values{"state": {"active"}}, &d)
	return d.ActiveTargets, err
}

// Ready reports whether the server answers /-/ready with 200.
func (c *Client) Ready(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/-/ready", nil)
	if err != nil {
		return false
	}
	res, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}
