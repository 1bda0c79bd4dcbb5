package sidecar

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
)

// A db node that is a Patroni group: the route names the group and its
// DSN lists the members; GET /v1/groups and the status view show its
// primary, members and problems from Patroni's records; after a failover
// (another leader) the view follows within groupsMaxAge.
func TestGroupsFromPatroniRecords(t *testing.T) {
	tree, s := zktest.NewMemoryTree(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	set := func(p, v string) { zktest.Put(t, s, p, v) }
	set("/service/g2/initialize", "1")
	set("/service/g2/config", `{"ttl":10,"synchronous_mode":true,"failsafe_mode":true,"ignore_slots":[{"type":"logical","plugin":"pgoutput"}]}`)
	set("/service/g2/members/g2-a", `{"conn_url":"postgres://127.0.0.1:7001/postgres","role":"master","state":"running","timeline":1,"xlog_location":100}`)
	set("/service/g2/members/g2-b", `{"conn_url":"postgres://127.0.0.1:7002/postgres","role":"replica","state":"running","timeline":1,"xlog_location":90}`)
	set("/service/g2/leader", "g2-a")
	set("/service/g2/sync", `{"leader":"g2-a","sync_standby":"g2-b"}`)
	nodes := clustertest.Nodes(2)
	nodes[1].DSN = "postgres://app@127.0.0.1:7001,127.0.0.1:7002/app?target_session_attrs=read-write"
	nodes[1].Patroni = bucketmap.Patroni{Namespace: "/service/", Scope: "g2"}
	clustertest.Create(t, s, tree.Root, nodes, 1)
	r := router.New(tree.Session(t), topo.MustPaths(tree.Root, "c1"), router.Options{})
	defer r.Close()
	if err := r.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	h := Handler(r, HandlerOptions{Session: s})

	// A user on the group: the answer names it.
	var uid string
	for i := 0; ; i++ {
		uid = "u" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		if rt, _ := r.Route(uid); rt.Node == "pg2" {
			break
		}
	}
	_, body := get(t, h, "/v1/route?uid="+uid)
	if !strings.Contains(body, `"group":"g2"`) || !strings.Contains(body, "127.0.0.1:7001,127.0.0.1:7002") {
		t.Fatalf("route of a user on the group: %s", body)
	}

	var out struct {
		Groups map[string]GroupView `json:"groups"`
	}
	res, body := get(t, h, "/v1/groups")
	if res.StatusCode != 200 || json.Unmarshal([]byte(body), &out) != nil {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	g := out.Groups["pg2"]
	if g.PatroniGroup == nil || g.Leader != "g2-a" || len(g.Members) != 2 || !g.Members[1].Sync || g.Members[1].LagBytes != 10 || len(out.Groups) != 1 {
		t.Fatalf("groups %s", body)
	}
	_, body = get(t, h, "/v1/status")
	if !strings.Contains(body, `"groups":{"pg2":`) || !strings.Contains(body, `"leader":"g2-a"`) {
		t.Fatalf("status lacks the group: %s", body)
	}

	// /metrics: the group is whole (leader, synchronous mode, a sync
	// standby); its records, made here with the world ACL as Patroni
	// makes them without x509, are one severe problem.
	_, body = get(t, h, "/metrics")
	for _, want := range []string{`shardvisor_router_patroni_group_whole{node="pg2"} 1`,
		`shardvisor_router_patroni_group_problems{node="pg2",severity="severe"} 1`,
		`shardvisor_router_patroni_group_problems{node="pg2",severity="warning"} 0`,
		`shardvisor_router_patroni_group_members{node="pg2"} 2`, `shardvisor_router_patroni_group_members_expected{node="pg2"} 2`,
		`shardvisor_router_patroni_group_members_running{node="pg2"} 2`, `shardvisor_router_patroni_group_leader{node="pg2"} 1`,
		`shardvisor_router_patroni_group_sync_standbys{node="pg2"} 1`, `shardvisor_router_patroni_group_synchronous_mode{node="pg2"} 1`} {
		if !strings.Contains(body, want) {
			t.Fatalf("metrics lack %s:\n%s", want, grepLines(body, "patroni"))
		}
	}
	// The sync standby goes: no longer whole, a warning more.
	set("/service/g2/sync", `{"leader":"g2-a","sync_standby":null}`)
	testenv.WaitFor(t, 5*time.Second, func() bool {
		_, body = get(t, h, "/metrics")
		return strings.Contains(body, `shardvisor_router_patroni_group_whole{node="pg2"} 0`) &&
			strings.Contains(body, `shardvisor_router_patroni_group_problems{node="pg2",severity="warning"} 1`)
	}, "the metrics to show the group without a synchronous standby")
	set("/service/g2/sync", `{"leader":"g2-a","sync_standby":"g2-b"}`)

	// The standby's Patroni goes (its ephemeral record with its session):
	// one member of the two the DSN lists, and the sync record's name no
	// longer counts as a synchronous standby.
	if err := s.Delete(ctx, "/service/g2/members/g2-b", -1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, func() bool {
		_, body = get(t, h, "/metrics")
		return strings.Contains(body, `shardvisor_router_patroni_group_members{node="pg2"} 1`) &&
			strings.Contains(body, `shardvisor_router_patroni_group_members_expected{node="pg2"} 2`) &&
			strings.Contains(body, `shardvisor_router_patroni_group_sync_standbys{node="pg2"} 0`)
	}, "the metrics to show the group a member short")
	set("/service/g2/members/g2-b", `{"conn_url":"postgres://127.0.0.1:7002/postgres","role":"replica","state":"running","timeline":1,"xlog_location":90}`)

	// Failover: g2-b leads. The view follows once the cache is older
	// than groupsMaxAge; the old leader's absence is no problem.
	if err := s.Delete(ctx, "/service/g2/leader", -1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, func() bool {
		_, body = get(t, h, "/metrics")
		return strings.Contains(body, `shardvisor_router_patroni_group_leader{node="pg2"} 0`) &&
			strings.Contains(body, `shardvisor_router_patroni_group_members{node="pg2"} 2`)
	}, "the metrics to show the group without a leader")
	set("/service/g2/leader", "g2-b")
	time.Sleep(groupsMaxAge + 50*time.Millisecond)
	// The first read after the view aged serves it stale and reads again
	// in the background; the new leader shows within moments.
	testenv.WaitFor(t, 5*time.Second, func() bool {
		_, body = get(t, h, "/v1/groups")
		out.Groups = nil
		return json.Unmarshal([]byte(body), &out) == nil && out.Groups["pg2"].Leader == "g2-b"
	}, "the group view to show the new leader")
	if strings.Contains(body, "api_url") {
		t.Fatalf("the sidecar hands out Patroni's REST API addresses: %s", body)
	}
	if res, _ := post(t, h, "/v1/groups", "{}"); res.StatusCode != 405 {
		t.Fatalf("POST /v1/groups: %d", res.StatusCode)
	}
	// Without a session (a map file) the answer is empty, not an error.
	if _, body := get(t, Handler(r, HandlerOptions{}), "/v1/groups"); strings.TrimSpace(body) != `{"groups":{}}` {
		t.Fatalf("no session: %s", body)
	}
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
