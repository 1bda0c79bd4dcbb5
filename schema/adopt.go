package schema

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/topo"
)

// BaselineID is the id of the change `schema adopt` records.
const BaselineID = "baseline"

// AdoptResult is what Adopt did.
type AdoptResult struct {
	From       string `json:"from"`
	New        bool   `json:"new"`
	Statements int    `json:"statements"`
	Bytes      int    `json:"bytes"`
	// InStep are the nodes marked as having the baseline (now or
	// before); Empty the nodes without any table, which `node prepare`
	// brings in step by replaying it; Differ the nodes that have tables
	// unlike the source's, which someone must make equal by hand.
	InStep      []string    `json:"in_step"`
	Empty       []string    `json:"empty"`
	Differ      []NodeError `json:"differ"`
	Unreachable []NodeError `json:"unreachable"`
}

// ErrHistoryExists: adopt starts a history, and one exists.
var ErrHistoryExists = errors.New("a schema history already exists")

// PgDump is the pg_dump binary Adopt runs: $PATH's, else Debian's for
// PostgreSQL 15.
func PgDump() string {
	if p, err := exec.LookPath("pg_dump"); err == nil {
		return p
	}
	return "/usr/lib/postgresql/15/bin/pg_dump"
}

// Adopt starts the history of a cluster created before it was kept: the
// schema of node from, as pg_dump --schema-only writes it (without the
// shardvisor schema, the fence's objects on the tables, owners,
// publications and subscriptions), becomes the baseline change (Seq 1).
// Every node whose tables match from's (the same tables and columns, and
// the same sharded tables by fence.CompareSchemas) is marked as having
// it, without running it; a node without tables gets it from `node
// prepare`, which replays the history. Run again, even after changes
// followed the baseline, it marks the nodes that match from (which must
// have the whole history) with every change from has.
func Adopt(ctx context.Context, st *bucketmap.Store, from bucketmap.NodeID, tables []topo.TableRecord, pgDump string, opt Options) (*AdoptResult, error) {
	a, lock, _, err := begin(ctx, st, &opt, nil, windowPolicy{})
	if err != nil {
		return nil, err
	}
	defer lock.Release(context.WithoutCancel(ctx))
	ctx, cancel := lock.Context(ctx)
	defer cancel()
	src, ok := a.m.Node(from)
	if !ok || src.State == bucketmap.NodeDown || src.State == bucketmap.NodeRemoved {
		return nil, fmt.Errorf("--from %s: %w among the nodes not marked down or removed", from, ErrUnknownNode)
	}
	res := &AdoptResult{From: string(from), InStep: []string{}, Empty: []string{}, Differ: []NodeError{}, Unreachable: []NodeError{}}
	base := a.find(BaselineID)
	if len(a.hist) > 0 && (base == nil || !base.Baseline) {
		return nil, hint.New(fmt.Errorf("%w: it begins with change %s (%s); adopt only starts a history", ErrHistoryExists, a.hist[0].ID, a.hist[0].Source),
			"a node without the schema gets it from `shardctl node prepare NODE`")
	}
	if base == nil {
		a.opt.event(Event{Node: string(from), Message: "dumping the schema with pg_dump --schema-only"})
		text, err := dumpSchema(ctx, src, pgDump)
		if err != nil {
			return nil, err
		}
		ch, err := Parse(BaselineID, "-- shardvisor:id "+BaselineID+"\n-- the schema of node "+string(from)+" when the history began\n"+text)
		if err != nil {
			return nil, fmt.Errorf("the dump of node %s: %w", from, err)
		}
		ch.Source = "pg_dump --schema-only of node " + string(from) + " at " + time.Now().UTC().Format(time.RFC3339)
		now := time.Now().UTC()
		base = &topo.SchemaChange{Version: topo.SchemaChangeVersion, ID: BaselineID, Seq: 1, SHA256: ch.SHA256, SQL: ch.SQL, Mode: ch.Mode,
			Statements: ch.Statements, Source: ch.Source, Baseline: true, By: a.opt.By, CreatedAt: now, UpdatedAt: now,
			State: topo.SchemaPending, Nodes: map[string]*topo.SchemaNodeStatus{}}
		if err := topo.CreateSchemaChange(ctx, a.s, a.p, base); err != nil {
			return nil, fmt.Errorf("recording the baseline: %w", err)
		}
		a.vers[base.ID] = 0
		a.hist = append(a.hist, base)
		res.New = true
	}
	res.Statements, res.Bytes = base.Statements, len(base.SQL)
	srcPrint, err := fingerprintOf(ctx, src, tables, a.opt.ConnectTimeout)
	if err != nil {
		return nil, fmt.Errorf("reading node %s: %w", from, err)
	}
	// A node in step with from gets what from has: the baseline and, when
	// changes followed it, those too (from must have them all).
	var marks []*topo.SchemaChange
	for _, c := range a.hist {
		if FailedNowhere(c) {
			continue
		}
		if !(c == base && res.New) && !a.applied(c, string(from)) {
			return res, hint.New(fmt.Errorf("--from %s lacks change %s: a node is marked in step by comparing it with a node that has the whole history", from, c.ID),
				"pick one: `shardctl schema status`")
		}
		marks = append(marks, c)
	}
	for _, id := range a.required {
		n, _ := a.m.Node(bucketmap.NodeID(id))
		p, err := fingerprintOf(ctx, n, tables, a.opt.ConnectTimeout)
		switch {
		case err != nil:
			res.Unreachable = append(res.Unreachable, NodeError{Node: id, Error: err.Error()})
			continue
		case len(p.tables) == 0:
			res.Empty = append(res.Empty, id)
			continue
		}
		if why := srcPrint.differs(p); why != "" {
			res.Differ = append(res.Differ, NodeError{Node: id, Error: fmt.Sprintf("differs from %s: %s", from, why)})
			continue
		}
		if err := markApplied(ctx, n, marks, a.opt); err != nil {
			res.Unreachable = append(res.Unreachable, NodeError{Node: id, Error: err.Error()})
			continue
		}
		now := time.Now().UTC()
		for _, c := range marks {
			if a.applied(c, id) {
				continue
			}
			if err := a.record(ctx, c, id, &topo.SchemaNodeStatus{State: topo.SchemaApplied, At: &now, StatementsDone: c.Statements}); err != nil {
				return res, err
			}
		}
		res.InStep = append(res.InStep, id)
	}
	return res, nil
}

// markRow is upsertRow that leaves a done row as it is.
const markRow = `INSERT INTO shardvisor.schema_changes (id, seq, sha256, statements_done, done, applied_by)
	VALUES ($1, $2, $3, $4, $5, $6)
	ON CONFLICT (id) DO UPDATE SET statements_done = EXCLUDED.statements_done, done = true, applied_at = pg_catalog.now(), applied_by = EXCLUDED.applied_by
	WHERE NOT shardvisor.schema_changes.done`

// markApplied writes a node's rows of changes cs as done, without running
// them, in one transaction.
func markApplied(ctx context.Context, n bucketmap.Node, cs []*topo.SchemaChange, opt *Options) error {
	conn, err := connect(ctx, n, opt.ConnectTimeout)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := ensureHistory(ctx, conn); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, c := range cs {
			if _, err := tx.Exec(ctx, markRow, c.ID, c.Seq, c.SHA256, c.Statements, true, opt.By); err != nil {
				return err
			}
		}
		return nil
	})
}

// fingerprint is what Adopt compares, outside the system schemas and
// shardvisor: every ordinary or partitioned table with its columns and
// their types, every index by definition, view, sequence and function
// (not an extension's) by name, and the sharded tables' full comparison.
type fingerprint struct {
	tables  []string
	sharded []fence.TableSchema
}

func (f fingerprint) differs(g fingerprint) string {
	for _, t := range f.tables {
		if !slices.Contains(g.tables, t) {
			return "it lacks " + t
		}
	}
	for _, t := range g.tables {
		if !slices.Contains(f.tables, t) {
			return "it has " + t + " in addition"
		}
	}
	if d := fence.CompareSchemas("source", f.sharded, "node", g.sharded); len(d) > 0 {
		return d[0].Message
	}
	return ""
}

func fingerprintOf(ctx context.Context, n bucketmap.Node, tables []topo.TableRecord, timeout time.Duration) (fingerprint, error) {
	conn, err := connect(ctx, n, timeout)
	if err != nil {
		return fingerprint{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT pg_catalog.format('%I.%I(%s)', n.nspname, c.relname,
			pg_catalog.string_agg(pg_catalog.format('%I %s', a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)), ', ' ORDER BY a.attname))
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'shardvisor') AND n.nspname NOT LIKE 'pg\_%'
		GROUP BY n.nspname, c.relname ORDER BY 1`)
	if err != nil {
		return fingerprint{}, err
	}
	f := fingerprint{}
	if f.tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return fingerprint{}, err
	}
	// Beside the tables: their indexes, the views, sequences and
	// functions, by definition or signature.
	rows, err = conn.Query(ctx, `SELECT * FROM (
		SELECT pg_catalog.pg_get_indexdef(i.indexrelid) FROM pg_catalog.pg_index i
			JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'shardvisor') AND n.nspname NOT LIKE 'pg\_%'
		UNION ALL
		SELECT pg_catalog.format('%s %I.%I', CASE c.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' ELSE 'sequence' END, n.nspname, c.relname)
			FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relkind IN ('v', 'm', 'S') AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'shardvisor') AND n.nspname NOT LIKE 'pg\_%'
		UNION ALL
		SELECT pg_catalog.format('function %I.%I(%s)', n.nspname, p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid))
			FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
			WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'shardvisor') AND n.nspname NOT LIKE 'pg\_%'
			AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
	) o(def) ORDER BY 1`)
	if err != nil {
		return fingerprint{}, err
	}
	objects, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fingerprint{}, err
	}
	if len(f.tables) > 0 {
		f.tables = append(f.tables, objects...)
	}
	if len(tables) > 0 && len(f.tables) > 0 {
		v := readNode(ctx, n, tables, timeout)
		if v.err != nil {
			return fingerprint{}, v.err
		}
		f.sharded = v.schemas
	}
	return f, nil
}

// dumpSchema runs pg_dump --schema-only on node n and cleans its text.
// The password goes through the environment, never the command line.
func dumpSchema(ctx context.Context, n bucketmap.Node, pgDump string) (string, error) {
	pw, err := dbnode.Password(n)
	if err != nil {
		return "", err
	}
	if pgDump == "" {
		pgDump = PgDump()
	}
	cmd := exec.CommandContext(ctx, pgDump, "--schema-only", "--no-owner", "--no-publications", "--no-subscriptions",
		"--exclude-schema=shardvisor", "--dbname="+n.DSN)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10")
	if pw != "" {
		cmd.Env = append(cmd.Env, "PGPASSWORD="+pw)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("pg_dump of node %s (%s): %v: %s", n.ID, pgDump, err, strings.TrimSpace(errb.String()))
	}
	return CleanDump(out.String())
}

// CleanDump makes pg_dump's text a change: psql's \restrict and
// \unrestrict lines go (any other psql command is refused), and so do
// the statements that name the fence's objects (zz_shardvisor_*, which
// `node prepare` installs) or comment on an extension (only its owner
// may).
func CleanDump(text string) (string, error) {
	var kept []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, `\`) {
			if strings.HasPrefix(line, `\restrict `) || strings.HasPrefix(line, `\unrestrict `) {
				continue
			}
			return "", fmt.Errorf("the dump holds a psql command this tool does not run: %.40s", line)
		}
		kept = append(kept, line)
	}
	stmts, err := Split(strings.Join(kept, "\n"))
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, st := range stmts {
		s := st.SQL
		if strings.Contains(s, "zz_shardvisor_") || strings.HasPrefix(strings.ToUpper(stripLeadingComments(s)), "COMMENT ON EXTENSION") {
			continue
		}
		b.WriteString(stripLeadingComments(s))
		b.WriteString(";\n\n")
	}
	return b.String(), nil
}
