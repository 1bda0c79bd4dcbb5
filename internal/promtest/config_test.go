package promtest

import (
	"strings"
	"testing"
	"time"
)

func TestRender(t *testing.T) {
	c := Config{
		Jobs: []Job{
			{Name: "shardvisor-router", Static: []Static{Targets("127.0.0.1:8484")}},
			{Name: "shardvisor-supervisor", Scheme: "https",
				Static: []Static{{Targets: []string{"127.0.0.1:19090", "127.0.0.1:19091"}, Labels: map[string]string{"zone": "a", "env": `"demo"`}},
					{Targets: []string{"127.0.0.1:19092"}, Labels: map[string]string{"zone": "b"}}},
				TLS: &TLS{CAFile: "/tls/ca.crt", CertFile: "/tls/admin.crt", KeyFile: "/tls/admin.key"}},
		},
		EvalInterval: 2 * time.Second,
	}
	got, err := c.Render([]string{"/tmp/x/rules/shardvisor.rules.yml"})
	if err != nil {
		t.Fatal(err)
	}
	want := `global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 2s
rule_files:
  - "/tmp/x/rules/shardvisor.rules.yml"
scrape_configs:
  - job_name: "shardvisor-router"
    scheme: http
    metrics_path: "/metrics"
    static_configs:
      - targets:
          - "127.0.0.1:8484"
  - job_name: "shardvisor-supervisor"
    scheme: https
    metrics_path: "/metrics"
    tls_config:
      ca_file: "/tls/ca.crt"
      cert_file: "/tls/admin.crt"
      key_file: "/tls/admin.key"
    static_configs:
      - targets:
          - "127.0.0.1:19090"
          - "127.0.0.1:19091"
        labels:
          env: "\"demo\""
          zone: "a"
      - targets:
          - "127.0.0.1:19092"
        labels:
          zone: "b"
`
	if string(got) != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestRenderRefuses(t *testing.T) {
	for name, c := range map[string]Config{
		"no name":      {Jobs: []Job{{Static: []Static{Targets("a:1")}}}},
		"twice":        {Jobs: []Job{{Name: "j", Static: []Static{Targets("a:1")}}, {Name: "j", Static: []Static{Targets("a:2")}}}},
		"no targets":   {Jobs: []Job{{Name: "j"}}},
		"empty group":  {Jobs: []Job{{Name: "j", Static: []Static{Targets("a:1"), Targets()}}}},
		"scheme":       {Jobs: []Job{{Name: "j", Static: []Static{Targets("a:1")}, Scheme: "ftp"}}},
		"label name":   {Jobs: []Job{{Name: "j", Static: []Static{{Targets: []string{"a:1"}, Labels: map[string]string{"a-b": "c"}}}}}},
		"label digits": {Jobs: []Job{{Name: "j", Static: []Static{{Targets: []string{"a:1"}, Labels: map[string]string{"1a": "c"}}}}}},
	} {
		if _, err := c.Render(nil); err == nil || !strings.HasPrefix(err.Error(), "promtest: ") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}
