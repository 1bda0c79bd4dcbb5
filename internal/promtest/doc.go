// Package promtest runs Debian's Prometheus (/usr/bin/prometheus) in a
// test and asks it what it sees: a server of its own per test (a free
// port, its storage in the test's temporary directory, stopped by its pid
// when the test ends) scraping static targets by job, with rule files
// loaded from copies whose long `for:` durations a test may shorten
// (Shorten: the rules' expressions stay as deploy/prometheus ships them,
// and the server's Rewrites say what changed), and a typed client of its
// HTTP API: queries, rules, alerts and targets. DashboardQueries and
// Expand read a Grafana dashboard's queries and fill in its variables, so
// that a test can run every panel's query against the server.
//
// Test support only: no library package imports it.
package promtest
