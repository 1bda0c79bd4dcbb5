package devenv

import (
	"strings"
	"testing"
)

func TestWaitingOn(t *testing.T) {
	controldata := strings.Repeat("  Latest checkpoint's NextXID: 0:1388\n", 40)
	waiting := "2026-11-28 22:37:45,002 INFO: Waiting for checkpoint on pg5-m1 before rewind\n"
	cases := []struct {
		name, tail, want string
	}{
		{"waiting, then a cycle's controldata", "x\n" + waiting + "2026 WARNING: Postgresql is not running.\n" + controldata, "pg5-m1"},
		{"last line", waiting, "pg5-m1"},
		{"long past", waiting + strings.Repeat("INFO: no action.\n", 200), ""},
		{"rewound", "INFO: running pg_rewind from pg5-m1\n", ""},
		{"empty", "", ""},
	}
	for _, c := range cases {
		if got := waitingOn([]byte(c.tail)); got != c.want {
			t.Errorf("%s: waitingOn = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestCheckpointAnnounced(t *testing.T) {
	cases := []struct {
		rec  string
		want bool
	}{
		{`{"role":"master","state":"running","version":"3.0.2"}`, true},
		{`{"role":"primary","state":"running"}`, true},
		{`{"role":"master","checkpoint_after_promote":false}`, false},
		{`{"role":"replica","state":"running"}`, false},
		{`not json`, false},
		{``, false},
	}
	for _, c := range cases {
		if got := checkpointAnnounced([]byte(c.rec)); got != c.want {
			t.Errorf("checkpointAnnounced(%s) = %v, want %v", c.rec, got, c.want)
		}
	}
}
