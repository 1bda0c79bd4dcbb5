package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/cliutil"
)

// newApp is shardctl's whole command line in one place: every command's
// name, usage, description and flags, and the Action that runs it. The
// Actions live in the file of their topic (cluster.go, node.go, move.go, …);
// each parses its arguments, calls the library and prints.
func newApp() *cli.App {
	return &cli.App{
		Name:  "shardctl",
		Usage: "administer a shardvisor cluster: bucket map, db nodes, pools, moves",
		Description: "Every command reads --zk, --zk-root and --cluster (or SHARDVISOR_ZK, SHARDVISOR_ZK_ROOT, SHARDVISOR_CLUSTER).\n" +
			"Output is text for people; --json prints JSON for scripts. Exit status: 0 ok, 1 failure, 2 usage error.\n" +
			"A failure prints the error on stderr and, when there is something to run, a line \"hint: ...\" after it;\n" +
			"under --json it is one JSON object on stderr instead: {\"error\": ..., \"hint\": ...} (hint omitted when there is none).",
		Flags: append(cliutil.ZKFlags(), cliutil.OutputFlags("warn")...),
		// A --node value's DSN may hold commas (a multi-host DSN): urfave/cli
		// must not cut it there; initNodes splits lists (cliutil.SplitNodes).
		DisableSliceFlagSeparator: true,
		Commands: []*cli.Command{
			{
				Name:  "init",
				Usage: "create a cluster: its keystream seed, first bucket map and db nodes",
				Description: "Refuses to touch an existing cluster. The seed can never change afterwards.\n" +
					"With --zk-auth (or --zk-auth-file) the cluster is created with ACLs: only that identity may write,\n" +
					"and with --reader-auth(-file) readers need that identity; without it anyone may read.\n" +
					"With --x509-admin (ZooKeeper over TLS, --zk-tls-*) this certificate's identity is the admin instead,\n" +
					"every host with a certificate of the CA reads, and member records are kept to the host that made them.",
				Flags: []cli.Flag{
					&cli.IntFlag{Name: "level", Value: 8, EnvVars: []string{"SHARDVISOR_LEVEL"}, Usage: fmt.Sprintf("bucket level `N` (2^N buckets, 0..%d)", bucketmap.MaxLevel)},
					&cli.StringFlag{Name: "seed", EnvVars: []string{"SHARDVISOR_SEED"}, Usage: "keystream seed as `HEX` (at least 16 bytes)"},
					&cli.BoolFlag{Name: "random-seed", Usage: "generate a random 32-byte seed"},
					&cli.StringSliceFlag{Name: "node", EnvVars: []string{"SHARDVISOR_NODES"}, Usage: "db node `ID=DSN` (postgres:// URL without password); repeat, or list several separated by commas " +
						"(as in the variable: pg1=postgres://h1/app,pg2=postgres://h2/app); a multi-host DSN's commas stay in it"},
					&cli.StringFlag{Name: "password", EnvVars: []string{"SHARDVISOR_NODE_PASSWORD"}, Usage: "password `REF` for every node: env:NAME or file:/path"},
					&cli.StringSliceFlag{Name: "pool", EnvVars: []string{"SHARDVISOR_NODE_POOLS"}, Usage: "a node's application path `ID=DSN`: its pooler in transaction mode (PgBouncer), where routers and workers connect; " +
						"repeat or separate by commas as --node; a node without one serves applications on its DSN"},
					&cli.StringFlag{Name: "stream-user", EnvVars: []string{"SHARDVISOR_NODE_STREAM_USER"}, Usage: "`ROLE` the moves' subscriptions to every node log in as by the subscribing db server's client certificate, so no password goes into the subscriber's catalog (pg_hba cert; the DSN must verify the server: sslmode=verify-full)"},
					&cli.StringFlag{Name: "reader-auth", EnvVars: []string{"SHARDVISOR_READER_AUTH"}, Usage: "reader identity `user:password` allowed to read the cluster"},
					&cli.StringFlag{Name: "reader-auth-file", EnvVars: []string{"SHARDVISOR_READER_AUTH_FILE"}, Usage: "`file` with the reader identity"},
					&cli.BoolFlag{Name: "x509-admin", EnvVars: []string{"SHARDVISOR_INIT_X509_ADMIN"}, Usage: "ACLs by certificate: the identity of --zk-tls-cert is the admin, every host with a certificate of the CA reads, and member records are kept to the host that made them (docs/security.md)"},
				},
				Action: runInit,
			},
			{
				Name:  "status",
				Usage: "show the bucket map: level, version, nodes with their buckets and share, buckets not active",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "grid", Usage: "draw the node-by-bucket grid"},
					&cli.IntFlag{Name: "rows", Value: 32, Usage: "grid rows at most (buckets are grouped into ranges beyond)"},
				},
				Action: runStatus,
			},
			{
				Name:  "node",
				Usage: "manage db nodes in the registry, and their schema and fences",
				Subcommands: []*cli.Command{
					{
						Name:      "prepare",
						Usage:     "install the write fence on a db node (idempotent) and bring it in step with the map",
						ArgsUsage: "ID",
						Description: "Creates schema shardvisor (ownership table, meta row) and the fence trigger on every sharded table, drops\n" +
							"fence triggers from tables that are no longer sharded, fills the ownership table from the map, and reports\n" +
							"sharded tables that break the contract. Running it again changes nothing.",
						Action: runPrepare,
					},
					{
						Name:      "check",
						Usage:     "verify a db node against the data-side contract and the map; changes nothing",
						ArgsUsage: "ID",
						Description: "Reports every mismatch: missing tables, a key column that is not bigint NOT NULL, a primary key without it,\n" +
							"no index leading with it, the fence missing, outdated, disabled or out of step with the map, and every difference\n" +
							"between its sharded tables and those of each other node that is not down (columns, types with modifiers,\n" +
							"nullability, defaults, primary key, bucket-key index, replica identity). Exit status 1 if any.\n" +
							"It also warns (without failing) when the fleet's worst case, every supervisor's workers plus surge each\n" +
							"holding --pool-size connections, exceeds what the node's application path takes (its pooler's max_client_conn,\n" +
							"or the server's max_connections).\n" +
							"Once the cluster has a backup configuration (shardctl backup configure), a node without a stanza, with archiving\n" +
							"off or failing, without a backup or with a newest backup older than the max age fails the check too.",
						Flags: append([]cli.Flag{
							&cli.IntFlag{Name: "pool-size", Value: dbnode.AppMaxConns, EnvVars: []string{"SHARDVISOR_CHECK_POOL_SIZE"}, Usage: "connections each worker keeps per node, for the connection budget (the Go router's and the Python package's default)"},
						}, pgbackrestFlags()...),
						Action: runCheck,
					},
					{
						Name:      "reconcile",
						Usage:     "bring the fences of db nodes in step with the map, repairing and reporting drift",
						ArgsUsage: "[ID...]",
						Description: "Syncs each node's fence (down nodes too) to the current map: its buckets owned, the rest revoked.\n" +
							"With --watch it runs until stopped, as the cluster's continuous fence reconciler: every node is synced when\n" +
							"the map changes, retried every --retry while it cannot be (down, unreachable), and re-synced every --every\n" +
							"while it is in step; a node marked down refuses writes to the buckets it lost within --retry of answering\n" +
							"again. Run one (or more: they never undo each other) next to the rebalancer. Once, it exits 1 if a node\n" +
							"could not be brought in step or its fence is ahead of the map.",
						Flags: []cli.Flag{
							&cli.DurationFlag{Name: "every", EnvVars: []string{"SHARDVISOR_RECONCILE_EVERY"}, Usage: "keep running, once per `DURATION` (default: once); with --watch, how often a node in step is synced again (default 30s)"},
							&cli.BoolFlag{Name: "watch", EnvVars: []string{"SHARDVISOR_RECONCILE_WATCH"}, Usage: "run until stopped: follow the map and keep every node's fence in step, each node on its own"},
							&cli.DurationFlag{Name: "retry", EnvVars: []string{"SHARDVISOR_RECONCILE_RETRY"}, Usage: "with --watch: try a node that could not be synced (down, unreachable) again after `DURATION` (default 1s); bounds how long a returning down node accepts writes to buckets it lost"},
							&cli.DurationFlag{Name: "timeout", EnvVars: []string{"SHARDVISOR_RECONCILE_TIMEOUT"}, Usage: "with --watch: give up one node's sync (connect and flip) after `DURATION` (default 5s)"},
							&cli.StringFlag{Name: "metrics-addr", EnvVars: []string{"SHARDVISOR_RECONCILE_METRICS_ADDR"}, Usage: "with --watch: serve Prometheus metrics (shardvisor_fence_*) on `HOST:PORT`"},
						},
						Action: runReconcile,
					},
					{
						Name:      "add",
						Usage:     "register a db node (it gets buckets when the planner's moves run)",
						ArgsUsage: "ID DSN",
						Flags: append([]cli.Flag{
							&cli.IntFlag{Name: "weight", Value: 1, Usage: "relative capacity"},
							&cli.StringFlag{Name: "password", EnvVars: []string{"SHARDVISOR_NODE_PASSWORD"}, Usage: "password `REF`: env:NAME or file:/path"},
							&cli.StringFlag{Name: "pool-dsn", EnvVars: []string{"SHARDVISOR_NODE_POOL_DSN"}, Usage: "the application path `DSN`: the node's pooler in transaction mode (PgBouncer), where routers and workers connect (default: none, applications use the DSN)"},
							&cli.StringFlag{Name: "stream-user", EnvVars: []string{"SHARDVISOR_NODE_STREAM_USER"}, Usage: "`ROLE` the moves' subscriptions to the node log in as by the subscribing db server's client certificate, so no password goes into the subscriber's catalog (pg_hba cert; the DSN must verify the server: sslmode=verify-full)"},
						}, patroniCLIFlags()...),
						Action: runNodeAdd,
					},
					{
						Name:      "set-dsn",
						Usage:     "change how a db node is reached: its DSN, pooler, password reference and Patroni group (a plain node that became a group, say)",
						ArgsUsage: "ID DSN",
						Flags: append([]cli.Flag{
							&cli.StringFlag{Name: "password", EnvVars: []string{"SHARDVISOR_NODE_PASSWORD"}, Usage: "password `REF`: env:NAME or file:/path (default: keep the node's)"},
							&cli.StringFlag{Name: "pool-dsn", EnvVars: []string{"SHARDVISOR_NODE_POOL_DSN"}, Usage: "the application path `DSN`: the node's pooler in transaction mode (default: keep the node's; \"\" for none, applications then use the DSN)"},
							&cli.StringFlag{Name: "stream-user", EnvVars: []string{"SHARDVISOR_NODE_STREAM_USER"}, Usage: "`ROLE` the moves' subscriptions to the node log in as by the subscribing db server's client certificate, so no password goes into the subscriber's catalog (pg_hba cert; the DSN must verify the server: sslmode=verify-full) (default: keep the node's; \"\" for the DSN's user with the password)"},
							&cli.BoolFlag{Name: "no-patroni", EnvVars: []string{"SHARDVISOR_NODE_NO_PATRONI"}, Usage: "the node is no longer a Patroni group (without it, and without --patroni-scope, the node's group is kept)"},
						}, patroniCLIFlags()...),
						Action: runNodeSetDSN,
					},
					{Name: "drain", Usage: "mark a node draining: the rebalancer moves all its buckets away", ArgsUsage: "ID", Action: oneNode(drainNode)},
					{Name: "down", Usage: "mark a node dead: its buckets go at once to the others by weight, without copying", ArgsUsage: "ID", Action: oneNode(downNode)},
					{Name: "up", Usage: "make a draining or down node active again", ArgsUsage: "ID", Action: oneNode(upNode)},
					{Name: "remove", Usage: "take a node that owns no buckets out of the registry", ArgsUsage: "ID", Action: oneNode(removeNode)},
					{Name: "set-weight", Usage: "change a node's relative capacity", ArgsUsage: "ID WEIGHT", Action: runNodeSetWeight},
				},
			},
			{
				// The sharded-table list lives in the cluster record; see
				// docs/data-contract.md.
				Name:  "table",
				Usage: "manage the sharded tables (schema.table and its bucket key column)",
				Subcommands: []*cli.Command{
					{
						Name:        "add",
						Usage:       "declare a sharded table; then run `shardctl node prepare ID` on every node",
						ArgsUsage:   "SCHEMA.TABLE",
						Description: "The key column is a bigint holding keystream Key(Prefix64(user id)); the primary key must include it and an index must lead with it.",
						Flags: []cli.Flag{
							&cli.StringFlag{Name: "key", Usage: "bucket key `COLUMN` (bigint)", Required: true},
						},
						Action: runTableAdd,
					},
					{
						Name:      "remove",
						Usage:     "stop treating a table as sharded (`node prepare` then drops its fence trigger; GC no longer touches it)",
						ArgsUsage: "SCHEMA.TABLE",
						Action:    runTableRemove,
					},
					{Name: "list", Usage: "list the sharded tables", Action: runTableList},
				},
			},
			{
				Name:  "schema",
				Usage: "change the schema of every db node, recorded in ZooKeeper; show the history; find drift",
				Subcommands: []*cli.Command{
					{
						Name:      "apply",
						Usage:     "apply one change (a .sql file) to every db node: canary first, then the others; resumable",
						ArgsUsage: "FILE.sql",
						Description: "The change's id is the file's name without .sql, or the one a line \"-- shardvisor:id ID\" gives. It is recorded\n" +
							"(SQL, sha256, who, when, state per node) before it runs anywhere. It runs on the canary alone, then on every other\n" +
							"node not marked down or removed, prepared or not, --parallel at a time; each node first gets the recorded changes it lacks.\n" +
							"One transaction per node, with lock_timeout and retries; a change holding CREATE INDEX CONCURRENTLY (or another\n" +
							"statement PostgreSQL runs only outside a transaction) runs statement by statement, resumably. Applying it again\n" +
							"is a no-op where it is applied and resumes where it is not; an applied change's text cannot change.\n" +
							"It waits for moves in flight first, and moves wait for it. Moves in their rollback window do not hold it: a change\n" +
							"their reverse streams carry (ADD COLUMN, CREATE INDEX, COMMENT, ANALYZE) runs beside them, their old owners first, and\n" +
							"checks each stream afterwards; any other change closes their windows first (--windows close) or waits for them\n" +
							"(--windows wait). Exit status 1 unless applied on every node.",
						Flags: append([]cli.Flag{
							&cli.StringFlag{Name: "windows", Value: "close", Usage: "before a change reverse streams cannot carry (a DROP, a constraint...): `close` the rollback windows of the moves in one (they are done, their way back given up), or `wait` for them to end"},
							&cli.StringFlag{Name: "canary", Usage: "node `ID` that gets the change first, alone (default: the active node owning the fewest buckets)"},
							&cli.IntFlag{Name: "parallel", Value: 4, Usage: "nodes changed at once after the canary"},
							noPointFlag(),
						}, schemaFlags()...),
						Action: runSchemaApply,
					},
					{
						Name:        "status",
						Usage:       "the recorded schema history, each change's state, and the nodes a partial change misses",
						Description: "Exit status 1 when a change is not applied on every node not marked down or removed.",
						Flags: []cli.Flag{
							&cli.BoolFlag{Name: "sql", Usage: "include each change's SQL (with --json)"},
						},
						Action: runSchemaStatus,
					},
					{
						Name:  "diff",
						Usage: "compare every node's sharded tables (as moves do) and applied changes; exit 1 on drift",
						Description: "Reads every node not marked down or removed at once and compares each with the reference node: tables, columns, types,\n" +
							"nullability, defaults, keys, indexes, constraints; and lists the recorded changes a node's own history lacks.\n" +
							"The result is recorded for the status page and metrics.",
						Flags: []cli.Flag{
							&cli.StringFlag{Name: "reference", Usage: "node `ID` every other node is compared with (default: the first reachable by id)"},
							&cli.DurationFlag{Name: "connect-timeout", Value: 10 * time.Second, Usage: "bound on connecting to a db node"},
						},
						Action: runSchemaDiff,
					},
					{
						Name:  "adopt",
						Usage: "start the history of an existing cluster: a node's schema (pg_dump --schema-only) becomes the baseline",
						Description: "Records the schema of --from as change \"baseline\" and marks every node whose tables match it as having it.\n" +
							"A node without tables gets it from `shardctl node prepare`, which replays the history. Refused once a history exists.",
						Flags: append([]cli.Flag{
							&cli.StringFlag{Name: "from", Usage: "node `ID` whose schema every node should have"},
							&cli.StringFlag{Name: "pg-dump", Value: "", Usage: "pg_dump `PATH` (default: $PATH's, else /usr/lib/postgresql/15/bin/pg_dump)"},
						}, schemaFlags()...),
						Action: runSchemaAdopt,
					},
				},
			},
			{
				Name:      "split",
				Usage:     "split one bucket into its two halves, or, without BUCKET, every bucket (level n -> n+1); moves no data, one compare-and-swap write",
				ArgsUsage: "[BUCKET]",
				Description: "BUCKET is a bucket's number, or NUMBER/DEPTH once the map has mixed depths (shardctl status shows them).\n" +
					"Its halves are buckets one level deeper, on the same node; every other bucket is unchanged, and either\n" +
					"half can then move on its own. A map of mixed depths is stored in format version 2, which releases older\n" +
					"than this one refuse (and keep their last map): upgrade every router, supervisor and client first.\n" +
					"See docs/bucket-map.md, \"Mixed depths\".",
				Action: runSplit,
			},
			{
				Name:  "plan",
				Usage: "print the moves that would balance the live map (changes nothing)",
				Description: "--by count (the default) balances bucket counts by weight from the map alone. --by size measures each\n" +
					"bucket on its owner (as `shardctl buckets` does) and balances bytes by weight: it splits large buckets\n" +
					"first, as far as balance needs, then moves. See docs/bucket-map.md, \"Balancing by size\".",
				Flags:  append(append(policyFlags(), sizeFlags()...), measureFlags()...),
				Action: runPlan,
			},
			{
				Name:      "buckets",
				Usage:     "measure every bucket on its owner (rows and bytes of the sharded tables) and list the largest",
				ArgsUsage: " ",
				Description: "Counts are exact on a table whose statistics say it has fewer than --exact-below rows, and estimated\n" +
					"from a TABLESAMPLE SYSTEM sample of its pages otherwise (the method is shown per node and table).\n" +
					"Bytes are the table's size on disk (heap, TOAST, indexes) shared out by each bucket's row sizes.\n" +
					"Leftover rows, in buckets a node no longer owns (GC's to delete), are counted apart. Read-only.",
				Flags: append([]cli.Flag{
					&cli.IntFlag{Name: "top", Value: 20, EnvVars: []string{"SHARDVISOR_BUCKETS_TOP"}, Usage: "list the `N` largest buckets (0: all)"},
				}, measureFlags()...),
				Action: runBuckets,
			},
			{
				Name:      "map-encoding",
				Usage:     "show how the map record is stored in ZooKeeper, or switch it: plain or gzip",
				ArgsUsage: "[plain|gzip]",
				Description: "gzip makes every router and supervisor read a fraction of the map on each change. Switch to it only once\n" +
					"every process that reads the map runs a release that reads both forms: an older one refuses a compressed\n" +
					"map and keeps its last one. Switch back to plain before downgrading any of them. See docs/bucket-map.md.",
				Action: runMapEncoding,
			},
			{
				Name:      "assign",
				Usage:     "give one bucket to a db node (manual control)",
				ArgsUsage: "BUCKET NODE",
				// BUCKET: a number, or NUMBER/DEPTH at mixed depths.
				Description: "Copying a bucket's rows is `shardctl move`; assign only changes ownership and needs --no-copy to say so.\n" +
					"The previous owner goes into the bucket's history for GC.",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "no-copy", Usage: "change the owner without copying rows (the bucket is marked data-lost)"},
					&cli.BoolFlag{Name: "force", Usage: "also when the bucket is moving (cancels the move) or the node is not active"},
				},
				Action: runAssign,
			},
			{
				Name:      "simulate",
				Usage:     "try a sequence of changes offline and print each step's plan size and the final balance",
				ArgsUsage: "EVENT... (add:ID[=W] down:ID drain:ID up:ID remove:ID weight:ID=W split split:BUCKET)",
				Flags: append([]cli.Flag{
					&cli.IntFlag{Name: "level", Value: 8, Usage: "starting level"},
					&cli.StringFlag{Name: "nodes", Value: "n1,n2,n3", Usage: "starting nodes `ID[=W],...`"},
					&cli.BoolFlag{Name: "live", Usage: "start from the live map instead of --level/--nodes"},
				}, policyFlags()...),
				Action: runSimulate,
			},
			{
				Name:      "move",
				Usage:     "move one bucket's rows to another db node online",
				ArgsUsage: "BUCKET --to NODE",
				Flags: append([]cli.Flag{
					&cli.StringFlag{Name: "to", Usage: "target db `node`"},
					&cli.BoolFlag{Name: "no-copy", Usage: "only reassign ownership after a short pause; the rows are NOT copied (for data clients can re-create)"},
					windowFlag(15*time.Minute, "SHARDVISOR_MOVE_WINDOW"),
				}, moveFlags()...),
				Action: runMove,
				Subcommands: []*cli.Command{
					{Name: "status", Usage: "show one move", ArgsUsage: "ID", Action: runMoveStatus},
					{Name: "resume", Usage: "continue (or roll back) a move whose mover died or whose node was unreachable", ArgsUsage: "ID", Flags: moveFlags(), Action: runMoveResume},
					{
						Name: "rollback", Usage: "give a moved bucket back to its old owner, with every write made since the flip (in the move's rollback window)", ArgsUsage: "ID",
						Description: "For a move in state reversible (its window, --window of `shardctl move`): runs a rollback move from the new owner\n" +
							"back to the old one over the move's reverse stream (no copy; a write pause like a forward move's); the move ends\n" +
							"rolled_back. A rollback whose mover dies is finished, or started again, by `rebalance --watch`.",
						Flags: moveFlags(), Action: runMoveRollback,
					},
					{
						Name: "complete", Usage: "end a move's rollback window now: drop its reverse stream; the move is done and GC may prune the old copy", ArgsUsage: "ID",
						Description: "Refused for a move whose verification found a difference (it is rolled back) or whose rollback is in flight.",
						Action:      runMoveComplete,
					},
					{
						Name: "abort", Usage: "roll back a move that has not flipped, or (--after-failure) close a move that failed after its flip", ArgsUsage: "ID",
						Description: "Without --after-failure: rolls back a move before its flip (the source owns the bucket again).\n" +
							"With --after-failure, for a move in state failed (it flipped, then e.g. verification found a difference; GC skips\n" +
							"its range while it is failed, and `move resume` only repeats the failure): the node the map names as the bucket's\n" +
							"owner (normally the target, which has taken writes since the flip) holds the truth. It drops the move's leftover\n" +
							"subscription, publication and slot; counts and checksums the range on both nodes and REFUSES (the move stays\n" +
							"failed, exit 1) if the owner has fewer rows than the other node in any table; brings both fences to the map (the\n" +
							"owner owns the range, the other node does not); sets the record to aborted, with the counts added to its error.\n" +
							"GC then deletes the other node's copy after --grace (only while the owner has at least as many rows): save it\n" +
							"first if the copies differ and it holds anything the owner lacks. A paused rebalancer stays paused.",
						Flags: []cli.Flag{
							&cli.BoolFlag{Name: "after-failure", EnvVars: []string{"SHARDVISOR_MOVE_ABORT_AFTER_FAILURE"},
								Usage: "close a failed move: keep the map's owner as the truth (refused if it has fewer rows than the other node), make fences and record agree, release GC"},
						},
						Action: runMoveAbort,
					},
				},
			},
			{Name: "moves", Usage: "list current and past moves", Action: runMoves},
			{
				Name:  "rebalance",
				Usage: "execute the planner's moves until the map is balanced",
				Description: "Moves one bucket at a time by default (--concurrency K: never two on one node). Stops, and says why, when\n" +
					"a move fails, verification finds a difference (which also pauses it), a node is down, or ZooKeeper is\n" +
					"not connected. --watch is the automatic mode: one elected rebalancer per cluster runs on every map change.",
				Flags: append(append([]cli.Flag{
					&cli.BoolFlag{Name: "dry-run", EnvVars: []string{"SHARDVISOR_REBALANCE_DRY_RUN"}, Usage: "print the plan and change nothing"},
					&cli.BoolFlag{Name: "watch", EnvVars: []string{"SHARDVISOR_REBALANCE_WATCH"}, Usage: "automatic mode: keep running as the cluster's elected rebalancer (standing for election again after losing ZooKeeper); elected, on standby or paused, also take over every unfinished move whose mover died, in any state, once the dead mover's ZooKeeper session expires (see docs/moves.md, Recovery)"},
					&cli.BoolFlag{Name: "resume", EnvVars: []string{"SHARDVISOR_REBALANCE_RESUME"}, Usage: "clear a pause (after a verification mismatch was understood) and run"},
					&cli.BoolFlag{Name: "pause", EnvVars: []string{"SHARDVISOR_REBALANCE_PAUSE"}, Usage: "pause the rebalancer (a running one stops after its current moves; moves whose mover died are still healed)"},
					windowFlag(0, "SHARDVISOR_REBALANCE_WINDOW"),
					noPointFlag(),
					&cli.BoolFlag{Name: "set-mode", EnvVars: []string{"SHARDVISOR_REBALANCE_SET_MODE"}, Usage: "record --by as what the cluster balances from now on (a running --watch follows it and logs it): without it, a --by other than the recorded mode is refused"},
				}, append(append(policyFlags(), sizeFlags()...), measureFlags()...)...), moveFlags()...),
				Action: runRebalance,
				Subcommands: []*cli.Command{
					{
						Name:        "mode",
						Usage:       "show or set what the cluster balances: bucket count, size (live bytes) or rows",
						ArgsUsage:   "[MODE]",
						Description: modeUsage,
						Action:      runRebalanceMode,
					},
				},
			},
			{
				Name:  "gc",
				Usage: "delete, from each db node, the rows of buckets it no longer owns",
				Description: "Works from the bucket map's history. A range is deleted only if another node owns it, the change is older than\n" +
					"--grace, no move involves it, every live router and supervisor has applied the change, both fences agree with the\n" +
					"map, and the owner answers and holds at least as many of the range's rows per table (--min-owner-ratio).\n" +
					"Anything uncertain is skipped and reported (exit status 1).\n" +
					"Deletes run in batches of short transactions, walking either the key index (rows that sit together) or the\n" +
					"table's pages (rows spread over it), chosen per table; a run killed half-way is finished by the next one.\n" +
					"One GC runs at a time per cluster (a ZooKeeper lock). With --every it keeps running, once per period, and a\n" +
					"member record an earlier round saw that has vanished since still counts, at its last map version, for one\n" +
					"ZooKeeper session timeout (skip kind member-vanished): its host may still serve until its session ends.",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "node", Usage: "only the leftovers on node `ID`"},
					&cli.BoolFlag{Name: "dry-run", Usage: "print what would be deleted, per node, table and range, with row counts; delete nothing"},
					&cli.IntFlag{Name: "batch", Value: 20000, EnvVars: []string{"SHARDVISOR_GC_BATCH"}, Usage: "about `N` rows per delete transaction"},
					&cli.StringFlag{Name: "order", Value: "auto", EnvVars: []string{"SHARDVISOR_GC_ORDER"}, Usage: "batch walk `ORDER`: auto (per table, from a sample of where the range's rows sit), key (the key index) or heap (the table's pages)"},
					&cli.IntFlag{Name: "parallel", Value: 2, EnvVars: []string{"SHARDVISOR_GC_PARALLEL"}, Usage: "`N` connections per node deleting at once, each with its own batch transactions (1: one batch after another)"},
					&cli.Float64Flag{Name: "rate", EnvVars: []string{"SHARDVISOR_GC_RATE"}, Usage: "at most `ROWS/S` deleted per second, all connections together (0: no limit)"},
					&cli.DurationFlag{Name: "grace", Value: time.Hour, EnvVars: []string{"SHARDVISOR_GC_GRACE"}, Usage: "only ownership changes older than `DURATION`"},
					&cli.Float64Flag{Name: "min-owner-ratio", Value: 1, Usage: "the owner must hold at least `R` times the leftover rows of a range, per table (negative: no count check)"},
					&cli.DurationFlag{Name: "every", EnvVars: []string{"SHARDVISOR_GC_EVERY"}, Usage: "periodic mode: run once per `DURATION` until stopped"},
					&cli.StringFlag{Name: "metrics-addr", EnvVars: []string{"SHARDVISOR_GC_METRICS_ADDR"}, Usage: "serve Prometheus metrics on `HOST:PORT` (periodic mode)"},
				},
				Action: runGC,
			},
			{
				Name:  "pool",
				Usage: "show and edit supervisor pools (config, last swap, members)",
				Subcommands: []*cli.Command{
					{Name: "status", Usage: "show a pool's config version, last swap result and every running supervisor (member)", ArgsUsage: "POOL", Action: runPoolStatus},
					{Name: "get", Usage: "print a pool's config (edit it and give it back to `pool set --file`)", ArgsUsage: "POOL", Action: runPoolGet},
					{
						Name:      "set",
						Usage:     "validate a pool config and write it with compare-and-swap; every supervisor of the pool swaps to it",
						ArgsUsage: "POOL",
						Flags: []cli.Flag{
							&cli.StringFlag{Name: "file", Aliases: []string{"f"}, EnvVars: []string{"SHARDVISOR_POOL_CONFIG_FILE"},
								Usage: "pool config `FILE` (JSON; - for stdin); required"},
							&cli.IntFlag{Name: "expect-version", Value: -1, EnvVars: []string{"SHARDVISOR_POOL_EXPECT_VERSION"},
								Usage: "write only if the config's znode version is still `N` (from `pool get --json`); default: the version just read"},
						},
						Action: runPoolSet,
					},
				},
			},
			{
				Name:      "route",
				Usage:     "answer which db node holds each user id, from the live map (the sidecar's answer)",
				ArgsUsage: "UID... (or one per line on stdin)",
				Flags: []cli.Flag{
					&cli.Uint64Flag{Name: "map-version", Usage: "the map `version` the caller used: answers say moved when the owner differs since"},
				},
				Action: runRoute,
			},
			{
				Name:      "hash",
				Usage:     "print the bucket and keystream prefix of user ids",
				ArgsUsage: "UID... (or one per line on stdin)",
				Description: "Prints UID<TAB>BUCKET<TAB>PREFIX64 per user id, PREFIX64 as 16 lowercase hex digits.\n" +
					"Without --seed the cluster's seed is read from ZooKeeper.",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "seed", EnvVars: []string{"SHARDVISOR_SEED"}, Usage: "keystream seed as `HEX` (default: the cluster's)"},
					&cli.IntFlag{Name: "level", DefaultText: "none", EnvVars: []string{"SHARDVISOR_LEVEL"}, Usage: "bucket level `N` (2^N buckets, 0-32); default: the cluster map's level"},
				},
				Action: runHash,
			},
			{
				Name:  "acl",
				Usage: "check and repair the ZooKeeper ACLs of the cluster's znodes (as the admin: --zk-auth-file)",
				Description: "The ACL of the cluster's own znode is the rule: its digest entries with all permissions are the admin, the\n" +
					"others the reader (or anyone). Each znode takes the ACL of its kind: records and directories (admin all, reader\n" +
					"read), member directories (readers may also create and delete children), and the records readers write (member\n" +
					"records, pool status: owned by the admin's records identity, readers read and write). See docs/zookeeper-layout.md.",
				Subcommands: []*cli.Command{
					{
						Name:  "check",
						Usage: "list every znode whose ACL differs from the rule for its kind, and a missing or wrong ACL record; changes nothing",
						Description: "Walks the cluster's whole tree. Exit status 1 if anything differs (then run `shardctl acl repair`), 0 if not.\n" +
							"Needs the admin identity: ZooKeeper hides the hashes the rule is made of from everyone else.",
						Action: runACLCheck,
					},
					{
						Name:  "repair",
						Usage: "set every ACL that differs to the rule's and write the ACL record, printing what changed",
						Description: "Brings a cluster created by an older shardctl in line. Running it again changes nothing.\n" +
							"Pools that lack a members directory or status record get them from `shardctl pool set` (run it again).",
						Action: runACLRepair,
					},
				},
			},
			backupCommand(),
			restorePointCommand(),
			restoreCommand(),
			{
				Name:  "zk",
				Usage: "check the ZooKeeper ensemble",
				Subcommands: []*cli.Command{
					{Name: "ping", Usage: "open a session and time a write/read/delete round trip under the cluster's path", Action: runZKPing},
					{Name: "status", Usage: "ask every server of --zk for its mode (leader/follower) with the srvr command", Action: runZKStatus},
				},
			},
		},
		EnableBashCompletion: true,
	}
}

// policyFlags are the planner's policy (read by policy), shared by plan,
// simulate and rebalance.
func policyFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "concurrency", Value: 1, EnvVars: []string{"SHARDVISOR_MOVE_CONCURRENCY"}, Usage: "moves that may run at once (never two on one node)"},
		&cli.BoolFlag{Name: "auto-split", EnvVars: []string{"SHARDVISOR_AUTO_SPLIT"}, Usage: "split first while an active node would own fewer than --min-buckets-per-node buckets"},
		&cli.IntFlag{Name: "min-buckets-per-node", Value: 8, EnvVars: []string{"SHARDVISOR_MIN_BUCKETS_PER_NODE"}, Usage: "auto-split threshold"},
	}
}

// sizeFlags choose what plan and rebalance balance, and tune the planner
// by size (bucketmap.SizePolicy).
func sizeFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "by", Value: "count", EnvVars: []string{"SHARDVISOR_BALANCE_BY"}, Usage: "what to balance: `count` (buckets per node, from the map), size (the live bytes of the rows each node owns) or rows; without it, the cluster's mode (`shardctl rebalance mode`)"},
		&cli.Float64Flag{Name: "tolerance", Value: 0.10, EnvVars: []string{"SHARDVISOR_BALANCE_TOLERANCE"}, Usage: "by size: a node is balanced at up to (1+`F`) times its fair share by weight"},
		&cli.Float64Flag{Name: "improvement", Value: 0.01, EnvVars: []string{"SHARDVISOR_BALANCE_IMPROVEMENT"}, Usage: "by size: a move must lower the busier node's load by at least `F` of its fair share (smaller gains are not worth a copy)"},
		&cli.IntFlag{Name: "max-depth", Value: bucketmap.MaxDepth, EnvVars: []string{"SHARDVISOR_BALANCE_MAX_DEPTH"}, Usage: "by size: never split a bucket deeper than `D`"},
		&cli.Int64Flag{Name: "min-split-bytes", EnvVars: []string{"SHARDVISOR_BALANCE_MIN_SPLIT_BYTES"}, Usage: "by size: never split a bucket smaller than `BYTES`"},
	}
}

// measureFlags tune the measurement of bucket sizes (sizing.Options).
func measureFlags() []cli.Flag {
	return []cli.Flag{
		&cli.Int64Flag{Name: "exact-below", Value: 2_000_000, EnvVars: []string{"SHARDVISOR_SIZE_EXACT_BELOW"}, Usage: "count a table exactly when its statistics say it has fewer than `ROWS` rows, else sample it (-1: always exact)"},
		&cli.Int64Flag{Name: "sample-rows", Value: 200_000, EnvVars: []string{"SHARDVISOR_SIZE_SAMPLE_ROWS"}, Usage: "about `ROWS` rows read per sampled table"},
	}
}

// moveFlags are the mover's options (read by withMover), shared by move,
// move resume and rebalance.
func moveFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: "max-lag", Value: 250 * time.Millisecond, EnvVars: []string{"SHARDVISOR_MOVE_MAX_LAG"}, Usage: "fence only when replication lag (a marker's trip) is below this"},
		&cli.DurationFlag{Name: "pause-cap", Value: 2 * time.Second, EnvVars: []string{"SHARDVISOR_MOVE_PAUSE_CAP"}, Usage: "abort a move whose write pause would exceed this"},
		&cli.DurationFlag{Name: "member-wait", Value: 10 * time.Second, EnvVars: []string{"SHARDVISOR_MOVE_MEMBER_WAIT"}, Usage: "how long to wait for routers and supervisors to apply the moving map (then see --on-straggler)"},
		&cli.StringFlag{Name: "on-straggler", Value: "proceed", EnvVars: []string{"SHARDVISOR_MOVE_ON_STRAGGLER"},
			Usage: "`ACTION` when members have not applied the moving map within --member-wait: proceed (record them as stragglers in the move; the fence refuses their clients' writes to the old owner until they catch up) or abort the move"},
		&cli.DurationFlag{Name: "catchup-timeout", Value: 5 * time.Minute, EnvVars: []string{"SHARDVISOR_MOVE_CATCHUP_TIMEOUT"}, Usage: "give up when the lag stays above --max-lag this long"},
		&cli.StringFlag{Name: "metrics-addr", EnvVars: []string{"SHARDVISOR_MOVE_METRICS_ADDR"},
			Usage: "serve Prometheus metrics (shardvisor_move_stragglers_total, shardvisor_move_member_wait_seconds) on `HOST:PORT` while the command runs"},
	}
}

// windowFlag is a move's rollback window: 15 minutes for `move`, none for
// `rebalance`, whose many moves would each keep a reverse stream (a
// logical replication worker on the old owner, and its WAL on the new).
func windowFlag(def time.Duration, env string) cli.Flag {
	return &cli.DurationFlag{Name: "window", Value: def, EnvVars: []string{env},
		Usage: "keep the reverse stream this long after a verified flip, so that `shardctl move rollback ID` can give the bucket back with the writes made since (0: complete at once). The window ends with `shardctl move complete ID`, or when it runs out by a running `rebalance --watch`; without one the move stays reversible (GC keeps the old copy) until completed"}
}

// patroniCLIFlags name a node's Patroni group; its DSN must then be a
// multi-host DSN with target_session_attrs=read-write.
func patroniCLIFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "patroni-scope", EnvVars: []string{"SHARDVISOR_NODE_PATRONI_SCOPE"}, Usage: "the node is a Patroni group with this `SCOPE` on the cluster's ZooKeeper ensemble (its DSN lists the members, with target_session_attrs=read-write)"},
		&cli.StringFlag{Name: "patroni-namespace", Value: bucketmap.DefaultPatroniNamespace, EnvVars: []string{"SHARDVISOR_NODE_PATRONI_NAMESPACE"}, Usage: "Patroni's `NAMESPACE` (its namespace setting)"},
	}
}

// noPointFlag lets a change that takes a restore point first go on without
// one.
func noPointFlag() cli.Flag {
	return &cli.BoolFlag{Name: "no-restore-point", EnvVars: []string{"SHARDVISOR_NO_RESTORE_POINT"},
		Usage: "do not take a restore point first (one is taken when the cluster has backups configured; a failure to take it stops the change)"}
}

func backupCommand() *cli.Command {
	return &cli.Command{
		Name:      "backup",
		Usage:     "take backups of db nodes with pgBackRest (all nodes not removed, or the ones named); list them; configure each node's stanza",
		ArgsUsage: "[NODE...]",
		Description: "Each node's backups live in its pgBackRest stanza (shardctl backup configure), in the repository the pgBackRest\n" +
			"configuration of this host names: in production the repository host, which reaches the db hosts by pgBackRest's TLS\n" +
			"server or SSH. A Patroni group's members share the node's stanza; pgBackRest backs up whichever is primary.\n" +
			"Continuous WAL archiving (archive_command = pgbackrest archive-push) is the servers' own configuration.\n" +
			"Exit status 1 if any node's backup failed.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "type", Value: "incr", EnvVars: []string{"SHARDVISOR_BACKUP_TYPE"}, Usage: "backup `TYPE`: full, diff or incr (an incremental backup without a full one before it is taken full)"},
		}, pgbackrestFlags()...),
		Action: runBackup,
		Subcommands: []*cli.Command{
			{
				Name:      "list",
				Usage:     "show each node's backups with their WAL and LSN ranges, its archiving, and what is wrong",
				ArgsUsage: "[NODE...]",
				Description: "A problem: no stanza configured for a node (once the cluster has a backup configuration), archive_mode off,\n" +
					"archiving failing (pg_stat_archiver: the last failure after the last success), no backup, or a newest backup\n" +
					"older than the configured max age. Exit status 1 if there is any.",
				Flags:  pgbackrestFlags(),
				Action: runBackupList,
			},
			{
				Name:      "configure",
				Usage:     "set a node's pgBackRest stanza (and the cluster's max backup age)",
				ArgsUsage: "NODE",
				Flags: append([]cli.Flag{
					&cli.StringFlag{Name: "stanza", Usage: "the node's pgBackRest `STANZA`"},
					&cli.StringFlag{Name: "max-age", Usage: "a newest backup older than `DURATION` is a problem (default 26h)"},
					&cli.BoolFlag{Name: "remove", Usage: "forget the node's stanza"},
					&cli.BoolFlag{Name: "create", Usage: "also run pgbackrest stanza-create for it (idempotent)"},
				}, pgbackrestFlags()...),
				Action: runBackupConfigure,
			},
		},
	}
}

func restorePointCommand() *cli.Command {
	return &cli.Command{
		Name:  "restore-point",
		Usage: "cluster restore points: a named WAL record on every db node at one map version, recorded with the map",
		Subcommands: []*cli.Command{
			{
				Name:      "create",
				Usage:     "cut a restore point on every db node and record it with the map version, the map and the moves in flight",
				ArgsUsage: "NAME",
				Description: "No write is held: each node's point is written at once, and the cut holds if the map did not change\n" +
					"meanwhile (read before and after); otherwise it is cut again under a new WAL name, up to 5 times.\n" +
					"Every node not removed must answer. Afterwards each node switches WAL so that the point is archived now.",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "reason", Value: "manual", Usage: "why the point was taken, for the record"},
					&cli.BoolFlag{Name: "no-switch-wal", Usage: "do not switch WAL after the point (it is archived within archive_timeout)"},
				},
				Action: runPointCreate,
			},
			{Name: "list", Usage: "list the restore points, oldest first", Flags: []cli.Flag{&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "with each node's LSN and the moves in flight"}}, Action: runPointList},
			{Name: "delete", Usage: "forget a restore point (its WAL records stay in the archive)", ArgsUsage: "NAME", Action: runPointDelete},
			{
				Name:      "show",
				Usage:     "show a restore point and, per node, the pgBackRest command that recovers its server to it (the whole-cluster runbook)",
				ArgsUsage: "NAME",
				Flags: append([]cli.Flag{
					&cli.StringFlag{Name: "data-dir", Value: "/var/lib/postgresql/15/{node}", EnvVars: []string{"SHARDVISOR_RESTORE_DATA_DIR"}, Usage: "the new servers' data `DIR` in the commands ({node} is the node's id)"},
				}, pgbackrestFlags()...),
				Action: runPointShow,
			},
			{
				Name:      "apply-map",
				Usage:     "after every node's server was recovered to the point and its DSN points there: make the map the point's, and clear the moves in flight then",
				ArgsUsage: "NAME",
				Description: "The map gets the point's buckets and owners (every bucket active) under today's node registry, at a new\n" +
					"version, and every fence syncs to it. For each move in flight at the point, its subscriptions, slots and\n" +
					"publications are dropped on the recovered servers, and an unflipped move's partial copy is deleted from its\n" +
					"target. Idempotent: run it again after a node that did not answer is back. Then: shardctl node check ID.",
				Action: runPointApplyMap,
			},
			{
				Name:  "watch",
				Usage: "take a restore point every --every, named PREFIX-TIME, keeping the newest --keep; check every node's backups every --check-every",
				Description: "Points never interleave (the backup lock); a point that fails is logged and the next is taken on time.\n" +
					"Run one per cluster, on the repository host; a second one only adds points.",
				Flags: append([]cli.Flag{
					&cli.DurationFlag{Name: "every", Value: 15 * time.Minute, EnvVars: []string{"SHARDVISOR_POINT_EVERY"}, Usage: "take a point every `DURATION`"},
					&cli.StringFlag{Name: "prefix", Value: "auto", EnvVars: []string{"SHARDVISOR_POINT_PREFIX"}, Usage: "the points' name `PREFIX`"},
					&cli.IntFlag{Name: "keep", Value: 96, EnvVars: []string{"SHARDVISOR_POINT_KEEP"}, Usage: "keep the newest `N` scheduled points, and the newest N taken before changes (schema, rebalance); 0: all"},
					&cli.DurationFlag{Name: "check-every", Value: time.Minute, EnvVars: []string{"SHARDVISOR_BACKUP_CHECK_EVERY"}, Usage: "check every node's backups and archiving every `DURATION`: metrics, the log, and the status record the status page shows"},
					&cli.StringFlag{Name: "metrics-addr", EnvVars: []string{"SHARDVISOR_BACKUP_METRICS_ADDR"}, Usage: "serve Prometheus metrics (shardvisor_backup_*, shardvisor_restore_point_*) on `HOST:PORT`"},
				}, pgbackrestFlags()...),
				Action: runPointWatch,
			},
		},
	}
}

func restoreCommand() *cli.Command {
	return &cli.Command{
		Name:      "restore",
		Usage:     "restore one bucket (or one user's rows), live, to a restore point or a time: from its backups into its current owner, pausing that bucket's writes only",
		ArgsUsage: "[BUCKET]",
		Description: "The bucket's owner at the point (each part's, if it was split or moved since: the point's map says) is recovered\n" +
			"from its backups into a scratch server beside the cluster (unix socket only, no archiving, no replication workers).\n" +
			"The bucket's rows are staged on its current owner, compared by primary key, and applied in one transaction that\n" +
			"holds the fence's drain locks of the bucket's range: writers to this bucket wait for it, nobody else does.\n" +
			"--mode replace makes the rows exactly what they were; --mode missing only adds back rows that are gone.\n" +
			"--to TIME needs a restore point at or before it (its map names the owners) and no move of the bucket in between.\n" +
			"--dry-run shows the rows that would come back, change and go, and changes nothing.\n" +
			"--user UID instead of BUCKET restores that user's rows only (every row of a user carries their bucket key).",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "to", Usage: "a restore point's `NAME`, a time (RFC 3339), or -DURATION before now (-1m)"},
			&cli.StringFlag{Name: "user", Usage: "restore only this user's rows (`UID`: their bucket key, in their bucket), not the whole bucket; the other users of the bucket keep everything"},
			&cli.StringFlag{Name: "mode", Value: "replace", Usage: "`MODE`: replace (the bucket exactly as it was) or missing (add back deleted rows only)"},
			&cli.StringSliceFlag{Name: "tables", Usage: "only these sharded `TABLES` (schema.table; repeat or separate by commas)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "show what would come back, change and go; change nothing"},
			&cli.StringFlag{Name: "scratch-dir", EnvVars: []string{"SHARDVISOR_SCRATCH_DIR"}, Usage: "`DIR` for scratch servers (default: the system's temporary directory); it needs room for each recovered server"},
			&cli.StringFlag{Name: "pg-bin", Value: "/usr/lib/postgresql/15/bin", EnvVars: []string{"SHARDVISOR_PG_BIN"}, Usage: "`DIR` of PostgreSQL's pg_ctl, for scratch servers"},
		}, pgbackrestFlags()...),
		Action: runRestore,
		Subcommands: []*cli.Command{
			{Name: "list", Usage: "list the bucket restores recorded, oldest first, with the scratch directories of any that did not finish", Action: runRestoreList},
		},
	}
}
