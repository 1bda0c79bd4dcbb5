package topo

// Patroni groups: reads the state of a Patroni group (a PostgreSQL primary
// and its standbys, https://patroni.readthedocs.io) from the records
// Patroni keeps in ZooKeeper, the same ensemble shardvisor uses.
//
// shardvisor never writes there: Patroni owns its records. A db node that
// is a group is reached through a multi-host DSN with
// target_session_attrs=read-write, which every client (pgx, libpq,
// psycopg2) follows to the current primary on its own; this file is
// what operators and checks see: the leader, each member's role, state,
// timeline and lag, the synchronous standby, and whether the group's
// configuration keeps a move's replication slots (ignore_slots) and
// acknowledged writes (synchronous_mode) through a failover.
//
// The records, under <namespace><scope>/ (Patroni 3.0):
//
//	leader         ephemeral: the leader's member name
//	members/<name> ephemeral JSON, rewritten every loop: conn_url,
//	               api_url, role ("master" in 3.0, "primary" later),
//	               state, timeline, xlog_location
//	sync           {"leader": ..., "sync_standby": ...}
//	config         the dynamic configuration (ttl, synchronous_mode,
//	               ignore_slots, ...)
//	status         {"optime": <leader's LSN>, ...}
//	initialize     the system identifier of the bootstrapped cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/zksession"
)

// Member is one member of a group, from its record.
type PatroniMember struct {
	Name     string `json:"name"`
	Role     string `json:"role"` // "primary", "replica", "standby_leader" or what Patroni says
	State    string `json:"state"`
	ConnURL  string `json:"conn_url,omitempty"`
	APIURL   string `json:"api_url,omitempty"`
	Timeline int    `json:"timeline,omitempty"`
	// XLogLocation is the member's WAL position as it last reported it:
	// the written position on the primary, the replayed one on a replica.
	XLogLocation int64 `json:"xlog_location,omitempty"`
	// LagBytes is how far the member's reported position is behind the
	// leader's (0 for the leader; -1 when unknown).
	LagBytes int64 `json:"lag_bytes"`
	Leader   bool  `json:"leader,omitempty"`
	Sync     bool  `json:"sync_standby,omitempty"`
	// Error is set when the member's record could not be read or
	// decoded; the other fields are then empty.
	Error string `json:"error,omitempty"`
}

// Config is the part of the dynamic configuration shardvisor checks.
type PatroniConfig struct {
	TTL                   int                 `json:"ttl,omitempty"`
	LoopWait              int                 `json:"loop_wait,omitempty"`
	RetryTimeout          int                 `json:"retry_timeout,omitempty"`
	SynchronousMode       bool                `json:"synchronous_mode"`
	SynchronousModeStrict bool                `json:"synchronous_mode_strict,omitempty"`
	FailsafeMode          bool                `json:"failsafe_mode,omitempty"`
	IgnoreSlots           []map[string]string `json:"ignore_slots,omitempty"`
}

// Group is a group's state as its records say at one moment.
type PatroniGroup struct {
	Namespace string          `json:"namespace"`
	Scope     string          `json:"scope"`
	Leader    string          `json:"leader"` // "" while no member holds the leader key
	Members   []PatroniMember `json:"members"`
	// SyncStandbys are the members the sync record names.
	SyncStandbys []string       `json:"sync_standbys,omitempty"`
	Config       *PatroniConfig `json:"config,omitempty"`
	// Initialized is false until Patroni has bootstrapped the group.
	Initialized bool `json:"initialized"`
	// OpenACL: anyone who reaches the ensemble may rewrite the group's
	// configuration (Patroni 3.0 sets ACLs only for x509 identities,
	// its set_acls).
	OpenACL bool `json:"open_acl,omitempty"`
}

// worldMay: an ACL gives anyone one of perms.
func worldMay(acl []zk.ACL, perms int32) bool {
	return slices.ContainsFunc(acl, func(a zk.ACL) bool { return a.Scheme == "world" && a.Perms&perms != 0 })
}

// Dir is the ZooKeeper directory of a group's records.
func PatroniDir(namespace, scope string) string {
	return path.Join("/", namespace, scope)
}

// ErrNoPatroniGroup is returned by Read when the group has no records at all:
// a wrong scope or namespace, or Patroni never ran against this ensemble.
var ErrNoPatroniGroup = errors.New("no Patroni records")

// Read reads a group's records. A member whose record fails to decode is
// listed with Error set rather than failing the read: one bad member does
// not hide the others.
func ReadPatroni(ctx context.Context, s *zksession.Session, namespace, scope string) (*PatroniGroup, error) {
	dir := PatroniDir(namespace, scope)
	g := &PatroniGroup{Namespace: namespace, Scope: scope}
	names, _, err := s.Children(ctx, dir)
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, fmt.Errorf("patroni group %s: %w at %s (check the node's --patroni-scope and --patroni-namespace)", scope, ErrNoPatroniGroup, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("patroni group %s: %w", scope, err)
	}
	has := func(n string) bool { return slices.Contains(names, n) }
	g.Initialized = has("initialize")
	if has("leader") {
		b, _, err := s.Get(ctx, dir+"/leader")
		switch {
		case err == nil:
			g.Leader = strings.TrimSpace(string(b))
		case !errors.Is(err, zksession.ErrNoNode): // expired between the two reads: no leader
			return nil, fmt.Errorf("patroni group %s: leader: %w", scope, err)
		}
	}
	if has("sync") {
		if b, _, err := s.Get(ctx, dir+"/sync"); err == nil && len(b) > 0 {
			var sync struct {
				Leader      string `json:"leader"`
				SyncStandby string `json:"sync_standby"`
			}
			if json.Unmarshal(b, &sync) == nil && sync.SyncStandby != "" && (g.Leader == "" || sync.Leader == g.Leader) {
				g.SyncStandbys = strings.Split(sync.SyncStandby, ",")
			}
		}
	}
	// Open: anyone may write the config (archive_command, synchronous_mode)
	// or create and delete in the scope (the leader and failover keys).
	if acl, _, err := s.GetACL(ctx, dir); err == nil && worldMay(acl, zk.PermCreate|zk.PermDelete) {
		g.OpenACL = true
	}
	if has("config") {
		if acl, _, err := s.GetACL(ctx, dir+"/config"); err == nil && worldMay(acl, zk.PermWrite) {
			g.OpenACL = true
		}
		if b, _, err := s.Get(ctx, dir+"/config"); err == nil && len(b) > 0 {
			if c, err := decodePatroniConfig(b); err == nil {
				g.Config = c
			}
		}
	}
	var optime int64 = -1
	if has("status") {
		if b, _, err := s.Get(ctx, dir+"/status"); err == nil && len(b) > 0 {
			var st struct {
				Optime *int64 `json:"optime"`
			}
			if json.Unmarshal(b, &st) == nil && st.Optime != nil {
				optime = *st.Optime
			}
		}
	}
	if has("members") {
		mnames, _, err := s.Children(ctx, dir+"/members")
		if err != nil && !errors.Is(err, zksession.ErrNoNode) {
			return nil, fmt.Errorf("patroni group %s: members: %w", scope, err)
		}
		sort.Strings(mnames)
		for _, name := range mnames {
			m := PatroniMember{Name: name, LagBytes: -1}
			b, _, err := s.Get(ctx, dir+"/members/"+name)
			if errors.Is(err, zksession.ErrNoNode) {
				continue // its session ended between the two reads
			}
			if err != nil {
				m.Error = err.Error()
			} else if err := decodePatroniMember(b, &m); err != nil {
				m.Error = err.Error()
			}
			m.Leader = name == g.Leader
			m.Sync = slices.Contains(g.SyncStandbys, name)
			g.Members = append(g.Members, m)
		}
	}
	// The leader's own record is rewritten every loop, so its position is
	// at least as fresh as the status record's optime.
	for _, m := range g.Members {
		if m.Leader && m.XLogLocation > optime {
			optime = m.XLogLocation
		}
	}
	for i := range g.Members {
		m := &g.Members[i]
		switch {
		case m.Leader:
			m.LagBytes = 0
		case optime >= 0 && m.Error == "" && m.XLogLocation > 0:
			m.LagBytes = max(0, optime-m.XLogLocation)
		}
	}
	return g, nil
}

// decodePatroniConfig reads the fields Config names; ignore_slots values are
// strings in every matcher Patroni documents, anything else is kept as
// its JSON text so that it never matches by accident.
func decodePatroniConfig(b []byte) (*PatroniConfig, error) {
	var raw struct {
		PatroniConfig
		IgnoreSlots []map[string]any `json:"ignore_slots"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, err
	}
	c := raw.PatroniConfig
	c.IgnoreSlots = nil
	for _, m := range raw.IgnoreSlots {
		sm := map[string]string{}
		for k, v := range m {
			if s, ok := v.(string); ok {
				sm[k] = s
			} else {
				js, _ := json.Marshal(v)
				sm[k] = string(js)
			}
		}
		c.IgnoreSlots = append(c.IgnoreSlots, sm)
	}
	return &c, nil
}

func decodePatroniMember(b []byte, m *PatroniMember) error {
	var rec struct {
		ConnURL      string `json:"conn_url"`
		APIURL       string `json:"api_url"`
		Role         string `json:"role"`
		State        string `json:"state"`
		Timeline     int    `json:"timeline"`
		XLogLocation int64  `json:"xlog_location"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return fmt.Errorf("member record is not JSON: %v", err)
	}
	m.ConnURL, m.APIURL, m.State, m.Timeline, m.XLogLocation = rec.ConnURL, rec.APIURL, rec.State, rec.Timeline, rec.XLogLocation
	m.Role = rec.Role
	if m.Role == "master" { // Patroni before 3.0.3 says master
		m.Role = "primary"
	}
	return nil
}

// Primary returns the member holding the leader key, if any.
func (g *PatroniGroup) Primary() (PatroniMember, bool) {
	for _, m := range g.Members {
		if m.Leader {
			return m, true
		}
	}
	return PatroniMember{}, false
}

// Problem is something about a group that costs availability or data.
type PatroniProblem struct {
	// Severe problems lose acknowledged writes or break moves now; the
	// others leave no margin for the next failure.
	Severe  bool   `json:"severe"`
	Message string `json:"message"`
}

// Problems lists what is wrong with the group as shardvisor uses it.
func (g *PatroniGroup) Problems() []PatroniProblem {
	var out []PatroniProblem
	add := func(severe bool, format string, args ...any) {
		out = append(out, PatroniProblem{Severe: severe, Message: fmt.Sprintf(format, args...)})
	}
	if !g.Initialized {
		add(true, "Patroni has not bootstrapped the group (no initialize record)")
	}
	if g.Leader == "" {
		add(true, "no member holds the leader key: writes are refused until Patroni elects one (within its ttl)")
	} else if _, ok := g.Primary(); !ok {
		add(true, "the leader key names %s, which has no member record", g.Leader)
	}
	for _, m := range g.Members {
		switch {
		case m.Error != "":
			add(false, "member %s: %s", m.Name, m.Error)
		case !m.Leader && m.State != "running" && m.State != "streaming":
			add(false, "member %s is %s", m.Name, m.State)
		}
	}
	c := g.Config
	if c == nil {
		add(true, "no dynamic configuration (config record) to check")
		return out
	}
	if !c.SynchronousMode {
		add(true, "synchronous_mode is off: a failover may lose acknowledged writes (set synchronous_mode: true)")
	} else if len(g.SyncStandbys) == 0 && !c.SynchronousModeStrict {
		add(false, "synchronous_mode is on but no standby is synchronous now: a failover now may lose acknowledged writes")
	}
	if !c.FailsafeMode {
		add(false, "failsafe_mode is off: a ZooKeeper outage longer than retry_timeout demotes the primary, and the group refuses writes until the ensemble is back (set failsafe_mode: true)")
	}
	if g.OpenACL {
		add(true, "Patroni's records are writable by anyone who reaches the ensemble (world ACL): anyone can set an archive_command (run as postgres on the db hosts), turn synchronous_mode off or delete the leader key; run ZooKeeper with TLS and give Patroni zookeeper.set_acls (docs/security.md)")
	}
	if !PatroniKeepsLogicalSlots(c.IgnoreSlots) {
		add(true, "ignore_slots has no entry matching logical pgoutput slots ({type: logical, plugin: pgoutput}): Patroni drops a move's replication slot within seconds")
	}
	return out
}

// PatroniKeepsLogicalSlots reports whether an ignore_slots list makes Patroni
// leave every logical pgoutput slot alone, as moves need: a matcher that
// names no slot and no database and, if it names a type or plugin, names
// logical and pgoutput (Patroni's own matching rule).
func PatroniKeepsLogicalSlots(ignore []map[string]string) bool {
	for _, m := range ignore {
		if m["name"] != "" || m["database"] != "" {
			continue
		}
		if t := m["type"]; t != "" && t != "logical" {
			continue
		}
		if p := m["plugin"]; p != "" && p != "pgoutput" {
			continue
		}
		return true
	}
	return false
}

// ReadPatroniLeader reads only a group's leader key: the member name, or
// "" while no member holds it. One read, for callers that poll it.
func ReadPatroniLeader(ctx context.Context, s *zksession.Session, namespace, scope string) (string, error) {
	b, _, err := s.Get(ctx, PatroniDir(namespace, scope)+"/leader")
	if errors.Is(err, zksession.ErrNoNode) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// PatroniView is a group as people and the sidecar see it: its records
// read now, what is wrong with them, or why they could not be read.
type PatroniView struct {
	*PatroniGroup
	Problems []PatroniProblem `json:"problems"`
	// Error: the records could not be read at all.
	Error string `json:"error,omitempty"`
}

// ReadPatroniView is ReadPatroni for display: a group whose records
// cannot be read is a view with Error set, not a failure, so that one
// group's trouble never hides the rest of a status.
func ReadPatroniView(ctx context.Context, s *zksession.Session, namespace, scope string) *PatroniView {
	g, err := ReadPatroni(ctx, s, namespace, scope)
	if err != nil {
		return &PatroniView{PatroniGroup: &PatroniGroup{Namespace: namespace, Scope: scope}, Problems: []PatroniProblem{}, Error: err.Error()}
	}
	v := &PatroniView{PatroniGroup: g, Problems: g.Problems()}
	if v.Problems == nil {
		v.Problems = []PatroniProblem{}
	}
	return v
}

// Unsafe says why the group is not whole now ("" when it is): no leader,
// not in synchronous mode, or no synchronous standby. A failover in any
// of these may lose acknowledged rows (or is under way).
func (g *PatroniGroup) Unsafe() string {
	switch {
	case g.Leader == "":
		return "it has no leader (a failover is under way)"
	case g.Config == nil || !g.Config.SynchronousMode:
		return "it is not in synchronous mode (a failover may lose acknowledged rows)"
	case len(g.SyncStandbys) == 0:
		return "it has no synchronous standby now (a failover now may lose acknowledged rows)"
	}
	return ""
}
