package sidecar

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

// The status page and the metrics show each pooled node's pooler as its
// admin console says: a live one with its clients, servers and limits, a
// dead one as down; a node without a pooler shows none.
func TestIntegrationPoolersOnStatusAndMetrics(t *testing.T) {
	pg := testenv.StartPGNodes(t, 1)
	pn := pg.Nodes[0]
	dead := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
	nodes := []bucketmap.Node{
		{ID: "pg1", DSN: pn.DSN, PoolDSN: pn.PoolDSN, Password: "file:" + pn.PasswordFile, Weight: 1, State: bucketmap.NodeActive},
		{ID: "pg2", DSN: pn.DSN, PoolDSN: "postgres://postgres@" + dead + "/x", Password: "file:" + pn.PasswordFile, Weight: 1, State: bucketmap.NodeActive},
		{ID: "pg3", DSN: pn.DSN, Password: "file:" + pn.PasswordFile, Weight: 1, State: bucketmap.NodeActive},
		// A password reference this host cannot resolve: never tried.
		{ID: "pg4", DSN: pn.DSN, PoolDSN: "postgres://postgres@127.0.0.1:1/x", Password: "env:SV_TEST_UNSET_POOL_PW", Weight: 1, State: bucketmap.NodeActive},
	}
	m, err := bucketmap.New(2, nodes, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	h := Handler(fileRouter(t, m), HandlerOptions{})
	_, body := get(t, h, "/v1/status")
	var v StatusView
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	live := net.JoinHostPort(pn.Host, strconv.Itoa(pn.PoolPort))
	p1, p2 := v.Pools["pg1"], v.Pools["pg2"]
	if p1 == nil || len(p1.Poolers) != 1 || p1.Poolers[0].Addr != live || p1.Poolers[0].Mode != "transaction" || p1.Poolers[0].ClientLimit != 2000 {
		t.Fatalf("pg1's pooler: %s", body)
	}
	if p2 == nil || p2.Errors[dead] == "" || len(v.Pools) != 3 || v.Pools["pg4"] == nil || !strings.Contains(v.Pools["pg4"].Error, "SV_TEST_UNSET_POOL_PW") {
		t.Fatalf("pg2's dead pooler, pg4's unresolved password, and no pg3: %s", body)
	}
	_, metrics := get(t, h, "/metrics")
	for _, want := range []string{
		fmt.Sprintf(`shardvisor_router_pooler_up{node="pg1",pooler=%q} 1`, live),
		fmt.Sprintf(`shardvisor_router_pooler_up{node="pg2",pooler=%q} 0`, dead),
		`shardvisor_router_pooler_up{node="pg4",pooler="127.0.0.1:1"} 0`,
		fmt.Sprintf(`shardvisor_router_pooler_client_limit{node="pg1",pooler=%q} 2000`, live),
		fmt.Sprintf(`shardvisor_router_pooler_server_limit{node="pg1",pooler=%q} 40`, live),
		fmt.Sprintf(`shardvisor_router_pooler_clients{node="pg1",pooler=%q}`, live),
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(metrics, `pooler_up{node="pg3"`) {
		t.Error("a node without a pooler has pooler metrics")
	}
}
