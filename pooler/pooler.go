// Package pooler reads the state of a db node's pooler (PgBouncer in
// transaction mode, the node's application path: bucketmap.Node.PoolDSN)
// through its admin console: client connections, server connections,
// waiting clients and the limits, per pooler (a Patroni group has one in
// front of each member). shardctl status, node check and the sidecar's
// status page and metrics show them.
//
// PgBouncer's admin console is the database "pgbouncer" on the pooler's
// port. It speaks only the simple query protocol, and answers SHOW
// commands whose columns change between versions: rows are read by
// column name, and a column a version lacks reads as 0.
package pooler

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
)

// AdminDatabase is PgBouncer's admin console.
const AdminDatabase = "pgbouncer"

// Stats is one pooler's state, summed over its pools (one per database
// and user).
type Stats struct {
	// Addr is the pooler's host:port as the pool DSN names it.
	Addr string `json:"addr"`
	// Clients are the client connections it holds: active (linked to a
	// server or idle between transactions) and waiting.
	Clients int `json:"clients"`
	// Waiting are the clients waiting for a server connection: above 0
	// for long, the pool is too small for the load (or the server slow).
	Waiting int `json:"waiting"`
	// MaxWait is the longest a waiting client has waited.
	MaxWait time.Duration `json:"max_wait_ns"`
	// Servers are its server connections to PostgreSQL, in any state.
	Servers int `json:"servers"`
	// ServerLimit is the most server connections it opens to one
	// database: max_db_connections, or default_pool_size when that is 0
	// (unlimited), per user.
	ServerLimit int `json:"server_limit"`
	// ClientLimit is max_client_conn: connections past it are refused.
	ClientLimit int `json:"client_limit"`
	// Mode is the pools' pool_mode ("transaction").
	Mode string `json:"mode,omitempty"`
}

// NodeStats is a node's poolers: one, or one per member of a group.
type NodeStats struct {
	Node    bucketmap.NodeID `json:"node"`
	Poolers []Stats          `json:"poolers"`
	// Errors name the poolers that did not answer, by address.
	Errors map[string]string `json:"errors,omitempty"`
}

// Clients, Waiting, Servers sum the node's poolers.
func (n NodeStats) Clients() (clients, waiting, servers int) {
	for _, p := range n.Poolers {
		clients += p.Clients
		waiting += p.Waiting
		servers += p.Servers
	}
	return
}

// ReadNode reads every pooler of a node's pool DSN (each host of a
// multi-host DSN on its own, whatever its role), at once. A node without
// a pooler is an error: it has nothing to read.
func ReadNode(ctx context.Context, n bucketmap.Node) (NodeStats, error) {
	out := NodeStats{Node: n.ID}
	if !n.Pooled() {
		return out, fmt.Errorf("db node %s has no pooler (no pool dsn)", n.ID)
	}
	cfg, err := adminConfig(n)
	if err != nil {
		return out, err
	}
	hosts := append([]*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...)
	// pgx lists a host once per TLS attempt (sslmode=prefer: TLS, then
	// plain; allow: the other way): read each address once, trying its
	// attempts in their order.
	var addrs []string
	tries := map[string][]*pgconn.FallbackConfig{}
	for _, h := range hosts {
		a := addr(h.Host, h.Port)
		if tries[a] == nil {
			addrs = append(addrs, a)
		}
		tries[a] = append(tries[a], h)
	}
	stats := make([]Stats, len(addrs))
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := tries[a]
			c := cfg.Copy()
			c.Host, c.Port, c.TLSConfig, c.Fallbacks = t[0].Host, t[0].Port, t[0].TLSConfig, t[1:]
			stats[i], errs[i] = Read(ctx, c)
		}()
	}
	wg.Wait()
	for i, a := range addrs {
		if errs[i] != nil {
			if out.Errors == nil {
				out.Errors = map[string]string{}
			}
			out.Errors[a] = errs[i].Error()
			continue
		}
		out.Poolers = append(out.Poolers, stats[i])
	}
	if len(out.Poolers) == 0 {
		return out, fmt.Errorf("db node %s: no pooler answered: %s", n.ID, joinErrors(out.Errors))
	}
	return out, nil
}

// adminConfig is the node's pool DSN aimed at the admin console, in the
// simple protocol, without the read-write check (a standby's pooler is
// read too).
func adminConfig(n bucketmap.Node) (*pgx.ConnConfig, error) {
	pc, err := dbnode.AppPoolConfig(n)
	if err != nil {
		return nil, err
	}
	cfg := pc.ConnConfig
	cfg.Database = AdminDatabase
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.ValidateConnect = nil
	delete(cfg.RuntimeParams, "target_session_attrs")
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > 3*time.Second {
		cfg.ConnectTimeout = 3 * time.Second
	}
	return cfg, nil
}

// Read connects to one pooler's admin console and reads its state.
func Read(ctx context.Context, cfg *pgx.ConnConfig) (Stats, error) {
	s := Stats{Addr: addr(cfg.Host, cfg.Port)}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return s, fmt.Errorf("pooler %s: %w", s.Addr, err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	pools, err := show(ctx, c, "POOLS")
	if err != nil {
		return s, fmt.Errorf("pooler %s: %w", s.Addr, err)
	}
	for _, r := range pools {
		if r["database"] == AdminDatabase {
			continue
		}
		s.Clients += r.int("cl_active") + r.int("cl_waiting")
		s.Waiting += r.int("cl_waiting")
		s.Servers += r.int("sv_active") + r.int("sv_idle") + r.int("sv_used") + r.int("sv_tested") + r.int("sv_login")
		w := time.Duration(r.int("maxwait"))*time.Second + time.Duration(r.int("maxwait_us"))*time.Microsecond
		s.MaxWait = max(s.MaxWait, w)
		if m := r["pool_mode"]; m != "" {
			s.Mode = m
		}
	}
	conf, err := show(ctx, c, "CONFIG")
	if err != nil {
		return s, fmt.Errorf("pooler %s: %w", s.Addr, err)
	}
	settings := map[string]string{}
	for _, r := range conf {
		settings[r["key"]] = r["value"]
	}
	s.ClientLimit, _ = strconv.Atoi(settings["max_client_conn"])
	s.ServerLimit, _ = strconv.Atoi(settings["max_db_connections"])
	if s.ServerLimit == 0 {
		s.ServerLimit, _ = strconv.Atoi(settings["default_pool_size"])
	}
	if s.Mode == "" {
		s.Mode = settings["pool_mode"]
	}
	return s, nil
}

// row is one row of a SHOW command, by column name.
type row map[string]string

func (r row) int(col string) int {
	n, _ := strconv.Atoi(r[col])
	return n
}

// show runs SHOW what on the admin console and returns its rows as text.
func show(ctx context.Context, c *pgx.Conn, what string) ([]row, error) {
	res := c.PgConn().Exec(ctx, "SHOW "+what)
	all, err := res.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("SHOW %s: %w", what, err)
	}
	var out []row
	for _, r := range all {
		for _, vals := range r.Rows {
			m := make(row, len(vals))
			for i, f := range r.FieldDescriptions {
				m[f.Name] = string(vals[i])
			}
			out = append(out, m)
		}
	}
	return out, nil
}

func addr(host string, port uint16) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + strconv.Itoa(int(port))
	}
	return host + ":" + strconv.Itoa(int(port))
}

func joinErrors(m map[string]string) string {
	var parts []string
	for _, a := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, a+": "+m[a])
	}
	return strings.Join(parts, "; ")
}

// NodeView is a pooled node's poolers as status pages show them: what
// they said, or why they did not.
type NodeView struct {
	NodeStats
	Error string `json:"error,omitempty"`
}

// ReadAll reads the poolers of every node of m that has one (removed
// nodes aside), all at once, each within timeout: a pooler that does not
// answer is reported in its view, never waited for longer.
func ReadAll(ctx context.Context, m *bucketmap.Map, timeout time.Duration) map[bucketmap.NodeID]*NodeView {
	out := map[bucketmap.NodeID]*NodeView{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range m.Nodes() {
		if !n.Pooled() || n.State == bucketmap.NodeRemoved {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			st, err := ReadNode(rctx, n)
			v := &NodeView{NodeStats: st}
			if err != nil {
				v.Error = err.Error()
			}
			mu.Lock()
			out[n.ID] = v
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}
