package pooler

import (
	"context"
	"fmt"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// The connection budget: how many connections the fleet's workers may
// open to one db node at worst, against what the node takes. Every
// worker routes to every node, so each keeps up to a pool of its own per
// node; during a swap a supervisor runs its workers and the surge of new
// ones at once.

// PoolDemand is one supervisor pool's share of the worst case.
type PoolDemand struct {
	Pool string `json:"pool"`
	// Members are the supervisors running the pool now.
	Members int `json:"members"`
	// Processes is workers + surge per supervisor: the most that run at
	// once, during a swap.
	Processes int `json:"processes_per_member"`
}

// Demand is the fleet's worst case against one node.
type Demand struct {
	Pools []PoolDemand `json:"pools"`
	// PerProcess is the pool size each worker keeps per node.
	PerProcess int `json:"per_process"`
	// Connections = Σ members × processes × PerProcess.
	Connections int `json:"connections"`
}

// ReadDemand reads every supervisor pool's config and live members and
// returns the fleet's worst case, each worker holding perProcess
// connections to a node. A pool whose config does not read is an error:
// an unknown share cannot be left out of a worst case.
func ReadDemand(ctx context.Context, s *zksession.Session, p topo.Paths, perProcess int) (Demand, error) {
	d := Demand{Pools: []PoolDemand{}, PerProcess: perProcess}
	pools, err := topo.ListPools(ctx, s, p)
	if err != nil {
		return d, fmt.Errorf("listing the supervisor pools: %w", err)
	}
	for _, name := range pools {
		cfg, _, err := topo.ReadPoolConfig(ctx, s, p, name)
		if err != nil {
			return d, fmt.Errorf("pool %s: %w", name, err)
		}
		members, err := topo.ListPoolMembers(ctx, s, p, name)
		if err != nil {
			return d, fmt.Errorf("pool %s: members: %w", name, err)
		}
		eff := cfg.Effective()
		pd := PoolDemand{Pool: name, Members: len(members), Processes: eff.Workers + *eff.Surge}
		d.Pools = append(d.Pools, pd)
		d.Connections += pd.Members * pd.Processes * perProcess
	}
	return d, nil
}

// Accepts is the most client connections a node takes on its
// application path: the smallest client limit of its poolers (clients
// reach one of them, the primary's), or for a node without a pooler what
// its server takes for non-superusers.
func Accepts(st NodeStats) int {
	lim := 0
	for _, p := range st.Poolers {
		if p.ClientLimit > 0 && (lim == 0 || p.ClientLimit < lim) {
			lim = p.ClientLimit
		}
	}
	return lim
}
