package topo

import (
	"context"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"time"

	"github.com/shardvisor/shardvisor/zksession"
)

// Schema changes in ZooKeeper (package schema applies them):
//
//	<cluster>/schema/changes/<id>   one SchemaChange record per change
//	<cluster>/schema/drift          the last `schema diff`'s findings
//	<cluster>/locks/schema          ephemeral: a schema change is running
//
// The lock is also the moves' gate: a move enters its first data state
// (copy, or fence for a move without a copy) only in a ZooKeeper
// transaction that creates and deletes the lock's node, which fails while
// a schema change holds it (EnterMoveData). A change, once it holds the
// lock, waits for the moves already past the gate.

// SchemaChangeVersion is the newest schema change record format.
const SchemaChangeVersion = 1

// SchemaDriftVersion is the newest drift record format.
const SchemaDriftVersion = 1

// MaxSchemaSQL bounds a change's SQL text, so that its record fits in a
// znode (zksession.MaxDataSize) with room for the per-node status.
const MaxSchemaSQL = 768 << 10

// Schema returns the directory of the schema records.
func (p Paths) Schema() string { return path.Join(p.Cluster(), "schema") }

// SchemaChanges returns the directory of the change records.
func (p Paths) SchemaChanges() string { return path.Join(p.Schema(), "changes") }

// SchemaChange returns the record of change id.
func (p Paths) SchemaChange(id string) string { return path.Join(p.SchemaChanges(), id) }

// SchemaDrift returns the record of the last drift check.
func (p Paths) SchemaDrift() string { return path.Join(p.Schema(), "drift") }

// SchemaEpoch returns the node whose data version counts the schema
// changes begun (each Apply, CatchUp and Adopt sets it, under the lock,
// before it touches a node).
func (p Paths) SchemaEpoch() string { return path.Join(p.Schema(), "epoch") }

// SchemaLock returns the ephemeral node held while a schema change runs.
func (p Paths) SchemaLock() string { return p.Lock("schema") }

var changeIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)

// ValidChangeID checks a schema change id: 1-100 of letters, digits, '.',
// '_' and '-', starting with a letter or digit (a safe znode name).
func ValidChangeID(id string) error {
	if !changeIDRE.MatchString(id) {
		return fmt.Errorf("schema change id %q is invalid: use 1-100 of A-Z, a-z, 0-9, '.', '_' and '-', starting with a letter or digit", id)
	}
	return nil
}

// Schema change states, of a change and of a change on one node.
const (
	// SchemaPending: not applied yet (a change: on no node yet).
	SchemaPending = "pending"
	// SchemaApplied: applied (a change: on every node not marked down or removed).
	SchemaApplied = "applied"
	// SchemaPartial: a change applied on some nodes, not yet on others.
	SchemaPartial = "partial"
	// SchemaFailed: the statement failed (a change: on its canary, and
	// applied on no node).
	SchemaFailed = "failed"
	// SchemaUnreachable: a node that could not be reached.
	SchemaUnreachable = "unreachable"
)

// Change modes.
const (
	// ModeTransaction: the whole change in one transaction per node.
	ModeTransaction = "transaction"
	// ModeStatements: each statement on its own (the change holds a
	// statement PostgreSQL refuses inside a transaction block, such as
	// CREATE INDEX CONCURRENTLY); each node's progress is counted by
	// statement.
	ModeStatements = "statements"
)

// SchemaChange is one recorded schema change at Paths.SchemaChange(ID):
// its SQL as applied, where it came from, and how far it got on each
// node. Seq orders the history: a node replays the changes in Seq order.
type SchemaChange struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	Seq     int    `json:"seq"`
	// SHA256 is the hex SHA-256 of SQL: an applied change's text never
	// changes.
	SHA256 string `json:"sha256"`
	SQL    string `json:"sql"`
	Mode   string `json:"mode"`
	// Statements counts SQL's statements.
	Statements int `json:"statements"`
	// Source says where the text came from: a file name, or the node a
	// baseline was taken from.
	Source string `json:"source,omitempty"`
	// Baseline: a node's schema as it was when the history began
	// (`schema adopt`); the nodes in step then are marked applied
	// without running it.
	Baseline  bool      `json:"baseline,omitempty"`
	By        string    `json:"by"` // user@host of the first apply
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	Canary    string    `json:"canary,omitempty"`
	// State is the change's state when the record was last written
	// (SchemaState recomputes it against the registry of the moment).
	State string                       `json:"state"`
	Nodes map[string]*SchemaNodeStatus `json:"nodes"`
	// Replaced lists the hashes of earlier texts with this id that
	// failed on their canary and were applied nowhere: such a change
	// may be edited.
	Replaced []string `json:"replaced,omitempty"`
}

// SchemaNodeStatus is a change on one node.
type SchemaNodeStatus struct {
	State string     `json:"state"`
	At    *time.Time `json:"at,omitempty"`
	Error string     `json:"error,omitempty"`
	// Attempts counts the transactions tried; LockTimeouts those that
	// gave up waiting for a lock (lock_timeout) and were retried.
	Attempts     int `json:"attempts,omitempty"`
	LockTimeouts int `json:"lock_timeouts,omitempty"`
	// BlockedMaxMS is the longest attempt, from its first statement to
	// its commit or rollback: how long the change held or queued for its
	// locks on this node at most. An application write queued behind it
	// waits about that long, plus its own time once the lock is free.
	BlockedMaxMS float64 `json:"blocked_max_ms,omitempty"`
	// AppWaitMaxMS is the longest an application statement was seen
	// waiting behind the change on this node (sampled from a second
	// connection every 25 ms).
	AppWaitMaxMS float64 `json:"app_wait_max_ms,omitempty"`
	// StatementsDone counts the statements done, in ModeStatements.
	StatementsDone int `json:"statements_done,omitempty"`
}

// Applied reports whether the change is applied on node.
func (c *SchemaChange) Applied(node string) bool {
	st := c.Nodes[node]
	return st != nil && st.State == SchemaApplied
}

// SchemaState is a change's state against the nodes that must have it
// (the registry's nodes not marked down or removed): applied when each has it, failed
// when none has it and the canary failed, pending when none has it
// otherwise, partial in between. It also returns the nodes missing it.
func SchemaState(c *SchemaChange, nodes []string) (string, []string) {
	var missing []string
	applied := 0
	for _, n := range nodes {
		if c.Applied(n) {
			applied++
		} else {
			missing = append(missing, n)
		}
	}
	for n := range c.Nodes {
		if c.Applied(n) && !slices.Contains(nodes, n) {
			applied++ // a node since removed or marked down still counts as started
		}
	}
	switch {
	case len(missing) == 0:
		return SchemaApplied, nil
	case applied > 0:
		return SchemaPartial, missing
	case c.Canary != "" && c.Nodes[c.Canary] != nil && c.Nodes[c.Canary].State == SchemaFailed:
		return SchemaFailed, missing
	}
	return SchemaPending, missing
}

// DecodeSchemaChange decodes a change record strictly.
func DecodeSchemaChange(znode string, data []byte) (*SchemaChange, error) {
	return decodeAs("schema change record", znode, data, SchemaChangeVersion, func(c *SchemaChange) error {
		if err := ValidChangeID(c.ID); err != nil {
			return err
		}
		if c.Seq < 1 {
			return fmt.Errorf("seq %d is not positive", c.Seq)
		}
		if c.Mode != ModeTransaction && c.Mode != ModeStatements {
			return fmt.Errorf("mode %q is not %q or %q", c.Mode, ModeTransaction, ModeStatements)
		}
		if len(c.SHA256) != 64 {
			return fmt.Errorf("sha256 %q is not 64 hex digits", c.SHA256)
		}
		for n, st := range c.Nodes {
			if st == nil {
				return fmt.Errorf("node %s has no status", n)
			}
		}
		return nil
	})
}

// ReadSchemaChange reads a change record and its znode version.
func ReadSchemaChange(ctx context.Context, s *zksession.Session, p Paths, id string) (*SchemaChange, int32, error) {
	return readAs(ctx, s, p.SchemaChange(id), DecodeSchemaChange)
}

// ListSchemaChanges reads every change record, in Seq order. A record
// that does not decode fails the list, naming it: replaying a history
// with a hole in it would apply the later changes out of order.
func ListSchemaChanges(ctx context.Context, s *zksession.Session, p Paths) ([]*SchemaChange, error) {
	out, _, err := ReadSchemaHistory(ctx, s, p)
	return out, err
}

// ReadSchemaHistory is ListSchemaChanges with each record's znode
// version, by id, for UpdateSchemaChange.
func ReadSchemaHistory(ctx context.Context, s *zksession.Session, p Paths) ([]*SchemaChange, map[string]int32, error) {
	ids, _, err := s.Children(ctx, p.SchemaChanges())
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, map[string]int32{}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	out := make([]*SchemaChange, 0, len(ids))
	vers := make(map[string]int32, len(ids))
	for _, id := range ids {
		c, v, err := ReadSchemaChange(ctx, s, p, id)
		if errors.Is(err, zksession.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if c.Nodes == nil {
			c.Nodes = map[string]*SchemaNodeStatus{}
		}
		out = append(out, c)
		vers[c.ID] = v
	}
	slices.SortFunc(out, func(a, b *SchemaChange) int { return a.Seq - b.Seq })
	return out, vers, nil
}

// CreateSchemaChange creates a change record, at znode version 0 (the
// caller holds the schema lock, which makes its Seq unique). It fails
// with zksession.ErrNodeExists if the id is taken.
func CreateSchemaChange(ctx context.Context, s *zksession.Session, p Paths, c *SchemaChange) error {
	data, err := EncodeCompact(c)
	if err != nil {
		return err
	}
	// JSON escapes grow the text (a '<' is 6 bytes): keep room for every
	// node's status as well.
	if limit := zksession.MaxDataSize - 128<<10; len(data) > limit {
		return fmt.Errorf("change %s: its record would take %d bytes, more than the %d a znode keeps for it: split the change into smaller ones", c.ID, len(data), limit)
	}
	return createNode(ctx, s, p, p.SchemaChange(c.ID), data)
}

// UpdateSchemaChange writes c by compare-and-swap on version and returns
// the new version.
func UpdateSchemaChange(ctx context.Context, s *zksession.Session, p Paths, c *SchemaChange, version int32) (int32, error) {
	data, err := EncodeCompact(c)
	if err != nil {
		return 0, err
	}
	st, err := s.Set(ctx, p.SchemaChange(c.ID), data, version)
	if err != nil {
		return 0, err
	}
	return st.Version, nil
}

// SchemaDrift is what the last `schema diff` found.
type SchemaDrift struct {
	Version int       `json:"version"`
	At      time.Time `json:"at"`
	By      string    `json:"by"`
	// Reference is the node every other node was compared with.
	Reference string   `json:"reference"`
	Nodes     []string `json:"nodes"`                // the nodes compared
	Skipped   []string `json:"skipped,omitempty"`    // not reachable
	Count     int      `json:"differences"`          // every difference found
	Blocking  int      `json:"blocking"`             // those that would refuse a move
	Sample    []string `json:"sample,omitempty"`     // the first few, described
	Tables    int      `json:"tables"`               // sharded tables compared
	ElapsedMS float64  `json:"elapsed_ms,omitempty"` // how long the comparison took
}

// DecodeSchemaDrift decodes a drift record strictly.
func DecodeSchemaDrift(znode string, data []byte) (*SchemaDrift, error) {
	return decodeAs[SchemaDrift]("schema drift record", znode, data, SchemaDriftVersion, nil)
}

// ReadSchemaDrift reads the drift record; nil, nil when none was written.
func ReadSchemaDrift(ctx context.Context, s *zksession.Session, p Paths) (*SchemaDrift, error) {
	d, _, err := readAs(ctx, s, p.SchemaDrift(), DecodeSchemaDrift)
	if errors.Is(err, zksession.ErrNoNode) {
		return nil, nil
	}
	return d, err
}

// WriteSchemaDrift writes the drift record, whoever wrote it last.
func WriteSchemaDrift(ctx context.Context, s *zksession.Session, p Paths, d *SchemaDrift) error {
	data, err := Encode(d)
	if err != nil {
		return err
	}
	_, err = s.Set(ctx, p.SchemaDrift(), data, zksession.AnyVersion)
	if errors.Is(err, zksession.ErrNoNode) {
		err = createNode(ctx, s, p, p.SchemaDrift(), data)
		if errors.Is(err, zksession.ErrNodeExists) {
			_, err = s.Set(ctx, p.SchemaDrift(), data, zksession.AnyVersion)
		}
	}
	return err
}

// LockSchema waits for the cluster's schema lock (Paths.SchemaLock),
// calling onWait with each refusal, as zksession.Lock does. While it is
// held no move enters its first data state.
func LockSchema(ctx context.Context, s *zksession.Session, p Paths, holder []byte, onWait func(*zksession.LockedError)) (*zksession.Lock, error) {
	return waitLock(ctx, s, p, p.SchemaLock(), holder, onWait)
}

// ErrSchemaChanging: a move may not enter its first data state, because a
// schema change holds the schema lock.
var ErrSchemaChanging = errors.New("a schema change is running")

// ReadSchemaEpoch returns the schema epoch's version, creating the node
// (version 0) if it is missing. A move reads it before it compares the
// source's and the target's schemas.
func ReadSchemaEpoch(ctx context.Context, s *zksession.Session, p Paths) (int32, error) {
	_, st, err := s.Get(ctx, p.SchemaEpoch())
	if errors.Is(err, zksession.ErrNoNode) {
		if err = createNode(ctx, s, p, p.SchemaEpoch(), nil); err != nil && !errors.Is(err, zksession.ErrNodeExists) {
			return 0, err
		}
		_, st, err = s.Get(ctx, p.SchemaEpoch())
	}
	return st.Version, err
}

// BumpSchemaEpoch marks the start of a schema change: every move that
// compared schemas before it must compare them again.
func BumpSchemaEpoch(ctx context.Context, s *zksession.Session, p Paths) error {
	_, err := s.Set(ctx, p.SchemaEpoch(), nil, zksession.AnyVersion)
	if errors.Is(err, zksession.ErrNoNode) {
		if err = createNode(ctx, s, p, p.SchemaEpoch(), nil); errors.Is(err, zksession.ErrNodeExists) {
			_, err = s.Set(ctx, p.SchemaEpoch(), nil, zksession.AnyVersion)
		}
	}
	return err
}

// EnterMoveData writes a move record (UpdateMove) in one transaction with
// two checks: that no schema change holds the schema lock (the lock's
// node is created and deleted again, which fails while it is held), and
// that the schema epoch is still at epoch (ReadSchemaEpoch, read before
// the move compared the schemas: no change began since). Either failing
// is ErrSchemaChanging, with nothing written: the move waits, compares
// again and retries. ZooKeeper orders the transaction and the lock: a
// change that takes the lock after it sees the move in its data state
// and waits for it.
func EnterMoveData(ctx context.Context, s *zksession.Session, p Paths, rec *MoveRecord, version, epoch int32) (int32, error) {
	set, err := UpdateMoveOp(p, rec, version)
	if err != nil {
		return 0, err
	}
	at := p.SchemaLock()
	gate, err := createDeleteOps(ctx, s, p, at)
	if err != nil {
		return 0, err
	}
	ops := append(gate, zksession.CheckOp(p.SchemaEpoch(), epoch), set)
	sts, err := s.Multi(ctx, ops...)
	var oe *zksession.OpError
	switch {
	case errors.Is(err, zksession.ErrNodeExists):
		return 0, fmt.Errorf("%w (%s is held)", ErrSchemaChanging, at)
	case errors.As(err, &oe) && oe.Path == p.SchemaEpoch():
		return 0, fmt.Errorf("%w (a schema change began since the move compared the schemas: %v)", ErrSchemaChanging, err)
	case err != nil:
		return 0, err
	}
	return sts[len(sts)-1].Version, nil
}

// SchemaChanging reports whether a schema change holds the schema lock,
// and its holder.
func SchemaChanging(ctx context.Context, s *zksession.Session, p Paths) (string, bool, error) {
	data, _, err := s.Get(ctx, p.SchemaLock())
	if errors.Is(err, zksession.ErrNoNode) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return string(data), true, nil
}
