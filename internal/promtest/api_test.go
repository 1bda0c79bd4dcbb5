package promtest

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Answers as Prometheus 2.42 gives them.
var answers = map[string]string{
	"/api/v1/query?query=up": `{"status":"success","data":{"resultType":"vector","result":[
		{"metric":{"__name__":"up","instance":"127.0.0.1:8484","job":"shardvisor-router"},"value":[1764504000.123,"1"]},
		{"metric":{"__name__":"up","instance":"127.0.0.1:19090","job":"shardvisor-supervisor"},"value":[1764504000.123,"NaN"]}]}}`,
	"/api/v1/query?query=nothing": `{"status":"success","data":{"resultType":"vector","result":[]}}`,
	"/api/v1/query?query=up%5B2s%5D": `{"status":"success","data":{"resultType":"matrix","result":[
		{"metric":{"job":"j"},"values":[[1764504000,"1"],[1764504001,"+Inf"]]}]}}`,
	"/api/v1/query?query=1":       `{"status":"success","data":{"resultType":"scalar","result":[1764504000.5,"1"]}}`,
	`/api/v1/query?query=%22s%22`: `{"status":"success","data":{"resultType":"string","result":[1764504000.5,"s"]}}`,
	"/api/v1/query?query=sum%28":  `{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\": 1:5: parse error: unclosed left parenthesis"}`,
	"/api/v1/rules": `{"status":"success","data":{"groups":[{"name":"shardvisor-moves","file":"/tmp/r/shardvisor.rules.yml","rules":[
		{"state":"firing","name":"ShardvisorBucketFrozen","query":"max(shardvisor_move_frozen_bucket_oldest_seconds) > 2","duration":3,
		 "labels":{"severity":"page"},"annotations":{"summary":"frozen"},"alerts":[{"labels":{"alertname":"ShardvisorBucketFrozen","severity":"page"},
		 "annotations":{"summary":"frozen"},"state":"firing","activeAt":"2026-11-30T12:00:01.5Z","value":"7.5e+00"}],
		 "health":"ok","evaluationTime":0.0001,"lastEvaluation":"2026-11-30T12:00:09Z","type":"alerting"},
		{"name":"shardvisor:moves:frozen","query":"max(shardvisor_move_frozen_bucket_oldest_seconds)","health":"err","lastError":"boom",
		 "evaluationTime":0.0001,"lastEvaluation":"2026-11-30T12:00:09Z","type":"recording"}],
		"interval":1,"limit":0,"evaluationTime":0.0002,"lastEvaluation":"2026-11-30T12:00:09Z"}]}}`,
	"/api/v1/alerts": `{"status":"success","data":{"alerts":[
		{"labels":{"alertname":"ShardvisorGroupMemberMissing","node":"pg5"},"annotations":{},"state":"pending","activeAt":"2026-11-30T12:00:01Z","value":"1e+00"},
		{"labels":{"alertname":"ShardvisorGroupMemberMissing","node":"pg6"},"annotations":{},"state":"firing","activeAt":"2026-11-30T11:59:01Z","value":"1e+00"},
		{"labels":{"alertname":"ShardvisorGroupNoSyncStandby","node":"pg5"},"annotations":{},"state":"pending","activeAt":"2026-11-30T12:00:01Z","value":"0e+00"}]}}`,
	"/api/v1/targets?state=active": `{"status":"success","data":{"activeTargets":[
		{"discoveredLabels":{},"labels":{"instance":"127.0.0.1:8484","job":"shardvisor-router"},"scrapePool":"shardvisor-router",
		 "scrapeUrl":"http://127.0.0.1:8484/metrics","globalUrl":"http://h:8484/metrics","lastError":"","lastScrape":"2026-11-30T12:00:09.5Z",
		 "lastScrapeDuration":0.002,"health":"up","scrapeInterval":"1s","scrapeTimeout":"1s"},
		{"discoveredLabels":{},"labels":{"instance":"127.0.0.1:1","job":"shardvisor-watchers"},"scrapePool":"shardvisor-watchers",
		 "scrapeUrl":"http://127.0.0.1:1/metrics","lastError":"connection refused","lastScrape":"0001-01-01T00:00:00Z","health":"unknown"}],"droppedTargets":[]}}`,
	"/api/v1/label/node/values?match%5B%5D=shardvisor_router_pooler_up": `{"status":"success","data":["pg1","pg5"]}`,
}

func fakeServer(t *testing.T) *Client {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Path
		if r.URL.RawQuery != "" {
			key += "?" + r.URL.RawQuery
		}
		if r.URL.Path == "/-/ready" {
			w.WriteHeader(http.StatusOK)
			return
		}
		a, ok := answers[key]
		if !ok {
			t.Errorf("unexpected request %s", key)
			http.NotFound(w, r)
			return
		}
		if strings.Contains(a, `"status":"error"`) {
			w.WriteHeader(http.StatusBadRequest)
		}
		_, _ = w.Write([]byte(a))
	}))
	t.Cleanup(srv.Close)
	return &Client{URL: srv.URL}
}

func TestQuery(t *testing.T) {
	c := fakeServer(t)
	ctx := context.Background()
	r, err := c.Query(ctx, "up")
	if err != nil {
		t.Fatal(err)
	}
	if r.Type != "vector" || r.Len() != 2 || r.Empty() || r.Vector[0].Metric["job"] != "shardvisor-router" || r.Vector[0].Value != 1 ||
		!math.IsNaN(r.Vector[1].Value) || !r.Vector[0].Time.Equal(time.UnixMilli(1764504000123)) {
		t.Fatalf("up: %+v", r)
	}
	if r, err := c.Query(ctx, "nothing"); err != nil || !r.Empty() || r.Type != "vector" {
		t.Fatalf("nothing: %+v %v", r, err)
	}
	r, err = c.Query(ctx, "up[2s]")
	if err != nil || r.Type != "matrix" || r.Empty() || len(r.Matrix[0].Points) != 2 || !math.IsInf(r.Matrix[0].Points[1].Value, 1) {
		t.Fatalf("up[2s]: %+v %v", r, err)
	}
	r, err = c.Query(ctx, "1")
	if err != nil || r.Type != "scalar" || r.Empty() || r.Scalar.Value != 1 || r.Scalar.Time.UnixMilli() != 1764504000500 {
		t.Fatalf("1: %+v %v", r, err)
	}
	if r, err := c.Query(ctx, `"s"`); err != nil || r.Type != "string" || r.String != "s" || r.Empty() {
		t.Fatalf(`"s": %+v %v`, r, err)
	}
	_, err = c.Query(ctx, "sum(")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != 400 || ae.ErrorType != "bad_data" || !strings.Contains(ae.Error(), "unclosed left parenthesis") {
		t.Fatalf("sum(: %v", err)
	}
}

func TestRules(t *testing.T) {
	groups, err := fakeServer(t).Rules(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 1 || len(groups[0].Rules) != 2 || groups[0].IntervalSeconds != 1 {
		t.Fatalf("%+v", groups)
	}
	a, r := groups[0].Rules[0], groups[0].Rules[1]
	if a.Type != "alerting" || a.State != "firing" || a.For() != 3*time.Second || len(a.Alerts) != 1 || a.Alerts[0].Name() != "ShardvisorBucketFrozen" ||
		!a.Alerts[0].ActiveAt.Equal(time.Date(2026, 11, 30, 12, 0, 1, 5e8, time.UTC)) || a.Labels["severity"] != "page" {
		t.Fatalf("alerting rule: %+v", a)
	}
	if r.Type != "recording" || r.Name != "shardvisor:moves:frozen" || r.Health != "err" || r.LastError != "boom" {
		t.Fatalf("recording rule: %+v", r)
	}
}

func TestAlerts(t *testing.T) {
	alerts, err := fakeServer(t).Alerts(context.Background())
	if err != nil || len(alerts) != 3 {
		t.Fatal(alerts, err)
	}
	if s, a := AlertState(alerts, "ShardvisorGroupMemberMissing"); s != "firing" || a.Labels["node"] != "pg6" {
		t.Fatalf("member missing: %s %+v", s, a)
	}
	if s, a := AlertState(alerts, "ShardvisorGroupNoSyncStandby"); s != "pending" || a.Labels["node"] != "pg5" {
		t.Fatalf("no sync standby: %s %+v", s, a)
	}
	if s, _ := AlertState(alerts, "ShardvisorBucketFrozen"); s != "inactive" {
		t.Fatalf("frozen: %s", s)
	}
}

func TestTargetsAndLabels(t *testing.T) {
	c := fakeServer(t)
	ts, err := c.Targets(context.Background())
	if err != nil || len(ts) != 2 {
		t.Fatal(ts, err)
	}
	if ts[0].ScrapePool != "shardvisor-router" || ts[0].Health != "up" || ts[0].ScrapeURL != "http://127.0.0.1:8484/metrics" ||
		ts[1].Health != "unknown" || ts[1].LastError != "connection refused" || !ts[1].LastScrape.IsZero() {
		t.Fatalf("%+v", ts)
	}
	vals, err := c.LabelValues(context.Background(), "node", "shardvisor_router_pooler_up")
	if err != nil || strings.Join(vals, ",") != "pg1,pg5" {
		t.Fatal(vals, err)
	}
	if !c.Ready(context.Background()) {
		t.Fatal("not ready")
	}
}

func TestDecodeRefusesWhatIsNoAnswer(t *testing.T) {
	var v any
	if err := decode("/api/v1/query", 502, []byte("<html>bad gateway</html>"), &v); err == nil || !strings.Contains(err.Error(), "not an API answer") {
		t.Fatalf("err = %v", err)
	}
	if _, err := parseResult([]byte(`{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}`)); err == nil {
		t.Fatal("a value that is no number was taken")
	}
	if _, err := parseResult([]byte(`{"resultType":"histogram","result":[]}`)); err == nil {
		t.Fatal("an unknown result type was taken")
	}
}
