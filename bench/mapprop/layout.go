package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
)

// buildMap makes the level-LEVEL map over NODES nodes in the chosen
// layout, at version 1 with no history.
func buildMap(now time.Time) (*bucketmap.Map, error) {
	var nodes []bucketmap.Node
	for i := range *nodeCount {
		id := fmt.Sprintf("db%03d", i+1)
		nodes = append(nodes, bucketmap.Node{ID: bucketmap.NodeID(id), DSN: "postgres://app@" + id + ".db.internal:5432/app?sslmode=verify-full",
			Password: "file:/etc/shardvisor/" + id + ".pw", Weight: 1, State: bucketmap.NodeActive})
	}
	switch *layout {
	case "fresh":
		return bucketmap.New(*level, nodes, now)
	case "grown":
		// Ten nodes, then one join at a time, each rebalanced by the
		// planner as the rebalancer would; history pruned as GC would.
		start := min(10, len(nodes))
		m, err := bucketmap.New(*level, nodes[:start], now)
		if err != nil {
			return nil, err
		}
		for _, n := range nodes[start:] {
			m.Version++
			if err := m.AddNode(n); err != nil {
				return nil, err
			}
			p, err := bucketmap.PlanFor(m, bucketmap.Policy{})
			if err != nil {
				return nil, err
			}
			if err := m.Apply(p); err != nil {
				return nil, err
			}
			m.PruneHistory(func(bucketmap.Handoff) bool { return true })
		}
		m.Version = 1
		return m, m.Validate()
	case "shuffled":
		m, err := bucketmap.New(*level, nodes, now)
		if err != nil {
			return nil, err
		}
		// The same counts per node, owners in random order: through the
		// record, the only way to set every owner at once.
		data, err := bucketmap.Encode(m)
		if err != nil {
			return nil, err
		}
		rec, err := bucketmap.DecodeMapRecord("", data)
		if err != nil {
			return nil, err
		}
		raw, err := base64.StdEncoding.DecodeString(rec.Owners)
		if err != nil {
			return nil, err
		}
		// Owners are big-endian uint16 node indices: shuffle them as pairs.
		rng := rand.New(rand.NewPCG(7, 11))
		rng.Shuffle(len(raw)/2, func(i, j int) {
			raw[2*i], raw[2*i+1], raw[2*j], raw[2*j+1] = raw[2*j], raw[2*j+1], raw[2*i], raw[2*i+1]
		})
		rec.Owners = base64.StdEncoding.EncodeToString(raw)
		js, err := json.Marshal(rec)
		if err != nil {
			return nil, err
		}
		return bucketmap.Decode("", js)
	}
	return nil, fmt.Errorf("--layout %q: want grown, fresh or shuffled", *layout)
}

// cpu times f, the median of n runs, in ms.
func cpu(n int, f func() error) (float64, error) {
	var xs []float64
	for range n {
		t := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		xs = append(xs, benchkit.MS(time.Since(t)))
	}
	return benchkit.Of(xs).P50, nil
}
