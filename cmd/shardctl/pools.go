package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/pooler"
)

// readPools reads the poolers of every node that has one, at once, each
// within a few seconds: a pooler that does not answer is reported, not
// waited for.
func readPools(ctx context.Context, m *bucketmap.Map) map[bucketmap.NodeID]*pooler.NodeView {
	return pooler.ReadAll(ctx, m, 5*time.Second)
}

// writePools prints each pooled node's poolers: clients against servers,
// the waiting clients, and the limits.
func writePools(w io.Writer, pools map[bucketmap.NodeID]*pooler.NodeView) {
	ids := make([]string, 0, len(pools))
	for id := range pools {
		ids = append(ids, string(id))
	}
	sort.Strings(ids)
	for _, id := range ids {
		v := pools[bucketmap.NodeID(id)]
		for _, p := range v.Poolers {
			fmt.Fprintf(w, "pooler of %s at %s: %d clients (%d waiting", id, p.Addr, p.Clients, p.Waiting)
			if p.MaxWait > 0 {
				fmt.Fprintf(w, ", longest %s", p.MaxWait.Round(time.Millisecond))
			}
			fmt.Fprintf(w, ", at most %d), %d server connections (at most %d per database), %s mode\n", p.ClientLimit, p.Servers, p.ServerLimit, p.Mode)
		}
		addrs := make([]string, 0, len(v.Errors))
		for a := range v.Errors {
			addrs = append(addrs, a)
		}
		sort.Strings(addrs)
		for _, a := range addrs {
			fmt.Fprintf(w, "pooler of %s at %s: UNREACHABLE: %s\n", id, a, clean(v.Errors[a]))
		}
		if len(v.Poolers) == 0 && len(v.Errors) == 0 && v.Error != "" {
			fmt.Fprintf(w, "pooler of %s: UNREADABLE: %s\n", id, clean(v.Error))
		}
	}
}
