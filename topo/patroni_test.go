package topo

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/zktest"
)

// Records as Patroni 3.0.2 writes them (member JSON trimmed to the
// fields read; Patroni writes more, which must be ignored).
const (
	patroniM1     = `{"conn_url":"postgres://127.0.0.1:25435/postgres","api_url":"http://127.0.0.1:26435/patroni","state":"running","role":"master","version":"3.0.2","xlog_location":50331968,"timeline":2}`
	patroniM2     = `{"conn_url":"postgres://127.0.0.1:25535/postgres","api_url":"http://127.0.0.1:26535/patroni","state":"running","role":"replica","version":"3.0.2","xlog_location":50331648,"replication_state":"streaming","timeline":2}`
	patroniConfig = `{"ttl":10,"loop_wait":2,"retry_timeout":4,"maximum_lag_on_failover":1048576,"synchronous_mode":true,"failsafe_mode":true,"ignore_slots":[{"type":"logical","plugin":"pgoutput"}],"postgresql":{"use_pg_rewind":true}}`
)

func TestReadPatroniGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, s := zktest.NewMemoryTree(t)
	dir := PatroniDir("/service/", "pg4")
	if _, err := ReadPatroni(ctx, s, "/service/", "pg4"); !errors.Is(err, ErrNoPatroniGroup) || !strings.Contains(err.Error(), "--patroni-scope") {
		t.Fatalf("missing group: %v", err)
	}
	for p, v := range map[string]string{
		dir + "/initialize":         "7312345678901234567",
		dir + "/config":             patroniConfig,
		dir + "/members/pg4-m1":     patroniM1,
		dir + "/members/pg4-m2":     patroniM2,
		dir + "/members/pg4-m3":     `not json`,
		dir + "/leader":             "pg4-m1",
		dir + "/sync":               `{"leader":"pg4-m1","sync_standby":"pg4-m2"}`,
		dir + "/status":             `{"optime":50331968,"slots":{}}`,
		"/service/other/leader":     "x",
		"/service/other/initialize": "1",
	} {
		zktest.Put(t, s, p, v)
	}
	g, err := ReadPatroni(ctx, s, "/service/", "pg4")
	if err != nil {
		t.Fatal(err)
	}
	if g.Leader != "pg4-m1" || !g.Initialized || len(g.Members) != 3 || strings.Join(g.SyncStandbys, ",") != "pg4-m2" {
		t.Fatalf("group %+v", g)
	}
	p, ok := g.Primary()
	if !ok || p.Name != "pg4-m1" || p.Role != "primary" || p.LagBytes != 0 || p.Timeline != 2 || p.APIURL == "" {
		t.Fatalf("primary %+v", p)
	}
	if r := g.Members[1]; r.Role != "replica" || !r.Sync || r.LagBytes != 320 || r.Leader {
		t.Fatalf("replica %+v", r)
	}
	if bad := g.Members[2]; bad.Error == "" || bad.LagBytes != -1 {
		t.Fatalf("undecodable member %+v", bad)
	}
	// The bad member's record is a problem; the open ACL (records created
	// here, as Patroni 3.0 does without x509, carry the world ACL) a severe
	// one: anyone can run commands on the db hosts through the config.
	if !g.OpenACL {
		t.Fatal("world-writable records not reported")
	}
	for _, pr := range g.Problems() {
		switch {
		case strings.Contains(pr.Message, "pg4-m3") && !pr.Severe:
		case strings.Contains(pr.Message, "world ACL") && pr.Severe:
		default:
			t.Fatalf("problem %+v", pr)
		}
	}

	// The leader's session ends: no leader, a severe problem, still read.
	if err := s.Delete(ctx, dir+"/leader", -1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Set(ctx, dir+"/config", []byte(`{"ttl":10,"synchronous_mode":false,"ignore_slots":[{"name":"other","type":"logical"}]}`), -1); err != nil {
		t.Fatal(err)
	}
	g, err = ReadPatroni(ctx, s, "/service/", "pg4")
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, pr := range g.Problems() {
		if pr.Severe {
			msgs = append(msgs, pr.Message)
		}
	}
	all := strings.Join(msgs, "\n")
	for _, want := range []string{"no member holds the leader key", "synchronous_mode is off", "ignore_slots"} {
		if !strings.Contains(all, want) {
			t.Errorf("severe problems lack %q:\n%s", want, all)
		}
	}
}

func TestPatroniKeepsLogicalSlots(t *testing.T) {
	for _, tc := range []struct {
		ignore []map[string]string
		want   bool
	}{
		{nil, false},
		{[]map[string]string{{"type": "logical", "plugin": "pgoutput"}}, true},
		{[]map[string]string{{"type": "logical"}}, true},
		{[]map[string]string{{"plugin": "pgoutput"}}, true},
		{[]map[string]string{{}}, true}, // matches every slot
		{[]map[string]string{{"type": "physical"}}, false},
		{[]map[string]string{{"type": "logical", "plugin": "wal2json"}}, false},
		{[]map[string]string{{"name": "sv_m1", "type": "logical"}}, false}, // one slot only
		{[]map[string]string{{"type": "logical", "database": "app"}}, false},
		{[]map[string]string{{"type": "physical"}, {"type": "logical"}}, true},
	} {
		if got := PatroniKeepsLogicalSlots(tc.ignore); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.ignore, got, tc.want)
		}
	}
}
