package promtest

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// Job is one scrape job: static targets, all scraped alike.
type Job struct {
	// Name is the job label (deploy/prometheus's rules and dashboard use
	// shardvisor-supervisor, shardvisor-router, shardvisor-watchers).
	Name string
	// Static are the job's targets, in groups that share labels.
	Static []Static
	// Scheme is http (default) or https; MetricsPath defaults to /metrics.
	Scheme      string
	MetricsPath string
	// TLS, with https: the CA to verify the targets by and the client
	// certificate to show them.
	TLS *TLS
}

// Static is a group of targets (host:port) and the labels added to each
// one's series (a static_config).
type Static struct {
	Targets []string
	Labels  map[string]string
}

// Targets is a group of targets without labels.
func Targets(addrs ...string) Static { return Static{Targets: addrs} }

// TLS is a scrape job's tls_config.
type TLS struct {
	CAFile, CertFile, KeyFile, ServerName string
}

// Config is what a test server scrapes and evaluates.
type Config struct {
	Jobs []Job
	// RuleFiles are the rule files to load (deploy/prometheus/*.yml), read
	// when the server starts and copied, shortened by MaxFor, into its
	// directory.
	RuleFiles []string
	// ScrapeInterval and EvalInterval default to 1 s.
	ScrapeInterval, EvalInterval time.Duration
	// MaxFor, when set, caps every alert's `for:` and every group's
	// `interval:` in the copies (Shorten); the server's Rewrites say what
	// changed.
	MaxFor time.Duration
	// Binary is the server (default /usr/bin/prometheus, Debian's).
	Binary string
}

func (c Config) withDefaults() Config {
	if c.ScrapeInterval <= 0 {
		c.ScrapeInterval = time.Second
	}
	if c.EvalInterval <= 0 {
		c.EvalInterval = time.Second
	}
	if c.Binary == "" {
		c.Binary = "/usr/bin/prometheus"
	}
	return c
}

// Render returns the prometheus.yml of c with ruleFiles (the paths the
// server reads: the copies) as its rule_files. Strings are written as
// JSON strings, which YAML reads as double-quoted scalars.
func (c Config) Render(ruleFiles []string) ([]byte, error) {
	c = c.withDefaults()
	var b strings.Builder
	q := func(s string) string { j, _ := json.Marshal(s); return string(j) }
	fmt.Fprintf(&b, "global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: %s\n",
		model.Duration(c.ScrapeInterval), model.Duration(c.ScrapeInterval), model.Duration(c.EvalInterval))
	if len(ruleFiles) > 0 {
		b.WriteString("rule_files:\n")
		for _, f := range ruleFiles {
			fmt.Fprintf(&b, "  - %s\n", q(f))
		}
	}
	b.WriteString("scrape_configs:\n")
	seen := map[string]bool{}
	for _, j := range c.Jobs {
		if j.Name == "" || seen[j.Name] {
			return nil, fmt.Errorf("promtest: job name %q empty or given twice", j.Name)
		}
		seen[j.Name] = true
		scheme := j.Scheme
		if scheme == "" {
			scheme = "http"
		}
		if scheme != "http" && scheme != "https" {
			return nil, fmt.Errorf("promtest: job %s: scheme %q", j.Name, scheme)
		}
		path := j.MetricsPath
		if path == "" {
			path = "/metrics"
		}
		fmt.Fprintf(&b, "  - job_name: %s\n    scheme: %s\n    metrics_path: %s\n", q(j.Name), scheme, q(path))
		if t := j.TLS; t != nil {
			b.WriteString("    tls_config:\n")
			for _, kv := range [][2]string{{"ca_file", t.CAFile}, {"cert_file", t.CertFile}, {"key_file", t.KeyFile}, {"server_name", t.ServerName}} {
				if kv[1] != "" {
					fmt.Fprintf(&b, "      %s: %s\n", kv[0], q(kv[1]))
				}
			}
		}
		b.WriteString("    static_configs:\n")
		n := 0
		for _, st := range j.Static {
			if len(st.Targets) == 0 {
				return nil, fmt.Errorf("promtest: job %s: a group without targets", j.Name)
			}
			n += len(st.Targets)
			b.WriteString("      - targets:\n")
			for _, t := range st.Targets {
				fmt.Fprintf(&b, "          - %s\n", q(t))
			}
			if len(st.Labels) == 0 {
				continue
			}
			b.WriteString("        labels:\n")
			keys := make([]string, 0, len(st.Labels))
			for k := range st.Labels {
				if !model.LabelName(k).IsValidLegacy() {
					return nil, fmt.Errorf("promtest: job %s: label name %q", j.Name, k)
				}
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				fmt.Fprintf(&b, "          %s: %s\n", k, q(st.Labels[k]))
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("promtest: job %s has no targets", j.Name)
		}
	}
	return []byte(b.String()), nil
}
