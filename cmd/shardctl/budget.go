package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/pooler"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// budget is node check's connection budget: the fleet's worst case on
// the node's application path against what that path takes.
type budget struct {
	pooler.Demand
	// Accepts is what the application path takes: the pooler's
	// max_client_conn, or the server's max_connections less the
	// superuser reserve; Via says which.
	Accepts int    `json:"accepts"`
	Via     string `json:"via"`
	Over    bool   `json:"over"`
	// Error says why the budget could not be worked out.
	Error string `json:"error,omitempty"`
}

// checkBudget works out the budget; a part it cannot read is reported in
// Error, never fails the check: the fence's verdict stands on its own.
func checkBudget(ctx context.Context, s *zksession.Session, p topo.Paths, n bucketmap.Node, conn *pgx.Conn, perProcess int) budget {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var b budget
	var err error
	if b.Demand, err = pooler.ReadDemand(rctx, s, p, perProcess); err != nil {
		b.Error = err.Error()
		return b
	}
	if n.Pooled() {
		b.Via = "pooler max_client_conn"
		st, err := pooler.ReadNode(rctx, n)
		if err != nil {
			b.Error = err.Error()
			return b
		}
		b.Accepts = pooler.Accepts(st)
	} else {
		b.Via = "server max_connections - superuser_reserved_connections"
		if err := conn.QueryRow(rctx, `SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int`).Scan(&b.Accepts); err != nil {
			b.Error = err.Error()
			return b
		}
	}
	b.Over = b.Accepts > 0 && b.Connections > b.Accepts
	return b
}

// writeBudget prints the budget: a warning when the worst case exceeds
// what the node takes, with what to do.
func writeBudget(w io.Writer, id bucketmap.NodeID, b budget) {
	if b.Error != "" {
		fmt.Fprintf(w, "node %s: connection budget unknown: %s\n", id, clean(b.Error))
		return
	}
	var parts []string
	for _, p := range b.Pools {
		parts = append(parts, fmt.Sprintf("%s: %d supervisors × %d workers", p.Pool, p.Members, p.Processes))
	}
	shares := "no supervisor pools"
	if len(parts) > 0 {
		shares = strings.Join(parts, ", ")
	}
	if !b.Over {
		fmt.Fprintf(w, "node %s: connections: the fleet opens at most %d (%s; %d each), the node takes %d (%s)\n", id, b.Connections, shares, b.PerProcess, b.Accepts, b.Via)
		return
	}
	fix := "put a pooler in front of it (`shardctl node set-dsn " + string(id) + " DSN --pool-dsn POOLER_DSN`: docs/data-contract.md)"
	if strings.HasPrefix(b.Via, "pooler") {
		fix = "raise the pooler's max_client_conn (its file-descriptor limit too)"
	}
	fmt.Fprintf(w, "WARNING node %s: the fleet may open %d connections (%s; %d each, surge included), more than the %d the node takes (%s): %s, or give fewer workers a pool per node\n",
		id, b.Connections, shares, b.PerProcess, b.Accepts, b.Via, fix)
}
