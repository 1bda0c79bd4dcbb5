// Package deploy holds no code: it is the home of the files an operator
// deploys beside the binaries (prometheus/: alert and recording rules,
// their promtool unit tests and an example scrape configuration;
// grafana/: the dashboard), and of the test that keeps them whole: every
// alert has a unit test that fires it and one that does not, every
// recording rule is used, and every dashboard query parses.
package deploy
