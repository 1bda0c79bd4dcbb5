package zksession

import (
	"context"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

// The test ensemble serves with one leader; with more dead servers than
// live ones in the connect string there is no quorum.
func TestIntegrationEnsemble(t *testing.T) {
	z := testenv.StartZK(t)
	cs, err := ParseConnect(z.ConnectString)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := Ensemble(ctx, cs, nil)
	if !e.Quorum || e.Serving != len(cs.Servers) || e.Leaders != 1 || len(e.Servers) != len(cs.Servers) {
		t.Fatalf("ensemble %s: %+v", cs, e)
	}
	n := len(cs.Servers)
	for range n + 1 {
		cs.Servers = append(cs.Servers, "127.0.0.1:1") // nothing listens there
	}
	e = Ensemble(ctx, cs, nil)
	if e.Quorum || e.Serving != n || e.Servers[len(e.Servers)-1].Err == "" {
		t.Fatalf("with %d dead servers: %+v", n+1, e)
	}
}
