package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit/kvload"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/migrate"
)

// Check is the acknowledged writes' check at the end of the run.
type Check struct {
	UsersChecked   int      `json:"users_checked"`
	Missing        int      `json:"missing_acknowledged_writes"`
	MissingSamples []string `json:"missing_samples,omitempty"`
	NewerThanAcked int      `json:"newer_than_acknowledged"`
}

// checkAcked looks up every user written with an acknowledgement on the
// owner of its bucket in the final map; its value must be the last
// acknowledged one (or that of a later write whose outcome the client did
// not learn).
func (b *bench) checkAcked(ctx context.Context, m *bucketmap.Map, w *kvload.Result) (Check, error) {
	keys, uids := map[bucketmap.NodeID][]int64{}, map[bucketmap.NodeID][]string{}
	for uid := range w.Acked {
		p := b.ks.Prefix64(uid)
		o := m.Owner(keystream.BucketOf(p, m.Level))
		keys[o], uids[o] = append(keys[o], keystream.Key(p)), append(uids[o], uid)
	}
	s := Check{UsersChecked: len(w.Acked)}
	var mu sync.Mutex // the nodes are checked at once
	err := clustertest.EachNode(ctx, m.Nodes(), func(_ int, n bucketmap.Node, c *pgx.Conn) error {
		ks, us := keys[n.ID], uids[n.ID]
		for i := 0; i < len(ks); i += 5000 {
			j := min(i+5000, len(ks))
			rows, err := c.Query(ctx, `SELECT k.uid, kv.v FROM unnest($1::bigint[], $2::text[]) AS k(bkey, uid)
				LEFT JOIN app.kv kv ON kv.bkey = k.bkey AND kv.uid = k.uid`, ks[i:j], us[i:j])
			if err != nil {
				return err
			}
			var uid string
			var v *int64
			_, err = pgx.ForEachRow(rows, []any{&uid, &v}, func() error {
				mu.Lock()
				defer mu.Unlock()
				want := w.Acked[uid]
				switch {
				case v != nil && *v == want:
				case v != nil && slices.Contains(w.Uncertain[uid], *v):
					s.NewerThanAcked++
				default:
					s.Missing++
					if len(s.MissingSamples) < 10 {
						got := "no row"
						if v != nil {
							got = fmt.Sprintf("v=%d", *v)
						}
						s.MissingSamples = append(s.MissingSamples, fmt.Sprintf("%s: acknowledged v=%d, owner %s has %s", uid, want, n.ID, got))
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	return s, err
}

// leftovers lists the moves' replication objects still on the nodes.
func (b *bench) leftovers(ctx context.Context) []string {
	var outl []string
	var mu sync.Mutex
	err := clustertest.EachNode(ctx, b.nodes, func(_ int, n bucketmap.Node, c *pgx.Conn) error {
		objs, err := migrate.ReplicationObjects(ctx, c)
		mu.Lock()
		defer mu.Unlock()
		for _, o := range objs {
			outl = append(outl, string(n.ID)+": "+o)
		}
		return err
	})
	if err != nil { // "node: error" a line
		outl = append(outl, strings.Split(err.Error(), "\n")...)
	}
	sort.Strings(outl)
	return outl
}
