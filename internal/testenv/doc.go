// Package testenv gives integration tests a real ZooKeeper ensemble and real
// PostgreSQL servers, shared by every test of a `go test` run and isolated
// per test.
//
// # Where the servers come from
//
// By default the servers are the ones of the dev environment (a 3-node
// ZooKeeper 3.8 ensemble on 127.0.0.1:21811-21813 and PostgreSQL 15 nodes on
// 127.0.0.1:25432, 25433, ...; see `scripts/devenv --help`). The first test in
// a test process that needs them checks that they are healthy and, if not,
// brings them up in this process with internal/devenv (what `scripts/devenv
// up` runs); so do the faults (ZK.Start, PGNode.Start and Stop,
// KillPrimary, CutZK...): no test runs a script. Concurrent test processes
// serialise bringing them up with a file lock in the state directory, so
// only one starts servers while the others wait. The servers run in
// sessions of their own and stay up after the tests end; `scripts/devenv
// down` stops them.
//
// The environment variables of scripts/devenv are honoured
// (SHARDVISOR_DEVENV_DIR, SHARDVISOR_ZK_PORT_BASE, SHARDVISOR_PG_PORT_BASE,
// SHARDVISOR_PG_NODES, SHARDVISOR_DEVENV_TIMEOUT).
//
// Alternatively, servers run elsewhere can be given in the environment:
//
//	SHARDVISOR_TEST_ZK=host:port,host:port,host:port    ZooKeeper connect string
//	SHARDVISOR_TEST_PG=postgres://user:pw@host:port/postgres?sslmode=disable,...
//	                                                    comma-separated admin DSNs
//
// Such servers are not controlled by testenv: ZK.Kill, ZK.Start, PGNode.Stop
// and PGNode.Start return ErrNotManaged.
//
// # Patroni groups
//
// StartPGGroups gives Patroni groups instead of plain nodes: devenv
// nodes GroupFirstNode.. (5 and 6), each a primary and a synchronous standby
// managed by Patroni with the devenv ZooKeeper ensemble as DCS (scope
// "pg5", namespace "/service/"). Their DSNs list every member with
// target_session_attrs=read-write and so reach the current primary.
// PGNode.KillPrimary SIGKILLs the primary's Patroni, postmaster and children
// at once (a standby takes over once the dead Patroni's ZooKeeper session
// expires, ~10 s), PGNode.StartMembers brings killed members back as
// standbys; both require Exclusive. StartPGNodes refuses to hand out a group
// as a plain node. With SHARDVISOR_TEST_PG group tests skip.
//
// # Long fault schedules
//
// A test whose fault schedule is long (server failovers, ZooKeeper
// outages, a mover killed in every move state) is named TestFaults... and
// calls Faults first: it skips unless SHARDVISOR_FAULTS=1. `make test`
// leaves these out; `make test-faults` sets the variable and runs every
// TestFaults test, and the reconnect tests again without -race.
//
// # Failing, not skipping
//
// `go test -short` skips every test that asks for a server (t.Skip). Otherwise
// a server that cannot be started fails the test (t.Fatal), with or without
// CI=true: an integration test never silently turns into a skip.
//
// # Isolation
//
// StartZK gives each call a fresh ZooKeeper path (ZK.Root, under
// /shardvisor-test) that is deleted recursively when the test ends. StartPG
// creates a fresh database with the same name on every node (PGNode.Database,
// "t_<test name>_<random>"), and at the end drops the subscriptions in it, the
// replication slots of it, and then the database itself (WITH (FORCE)).
// Cluster-wide objects are not isolated: tests that create roles or
// replication slots (a subscription creates a slot named after it on the
// publisher) must make the names unique, e.g. by including PGNode.Database.
//
// # Disruptive tests
//
// A test that kills a ZooKeeper server or stops a PostgreSQL node must call
// Exclusive(t) first. Exclusive takes a cross-process exclusive lock (flock on
// a file in the state directory) that every other testenv user, in this and in
// other test processes, holds shared while it runs; so the disruptive test
// runs alone and no other test sees its damage. Exclusive may be called before
// or after StartZK/StartPG in the same test, but not in a subtest whose parent
// test has already called StartZK/StartPG (that would wait for itself; it
// fails the test instead). When the test ends, Exclusive restarts every
// server that is down and waits until the whole environment is healthy
// before it releases the lock.
//
// # ZooKeeper superuser
//
// devenv starts ZooKeeper with a superuser ("super", digest
// authentication, password in <state dir>/zk/superpass); ZK.SuperAuth holds
// "super:<password>". The cleanup of ZK.Root authenticates with it, so tests
// may put restrictive ACLs under Root. For external servers set
// SHARDVISOR_TEST_ZK_SUPERAUTH=super:<password> to get the same.
//
// # PostgreSQL credentials
//
// The superuser is "postgres" with a generated password stored in
// <state dir>/pg/password (PGNode.PasswordFile, world-readable: this is a
// throwaway environment), also written as a pgpass file
// (PGNode.PGPassFile, usable as PGPASSFILE). PGNode.DSN has no password in
// it, so code under test has to get the password the way it would in
// production; PGNode.DSNWithPassword and PGNode.AdminDSN include it.
//
// # PgBouncer
//
// Every server the environment manages has a PgBouncer in transaction mode
// in front of it, 2000 ports above (PGNode.PoolPort): PGNode.PoolDSN and
// PoolDSNWithPassword reach the test's Database through it (a group's,
// every member's pooler with target_session_attrs=read-write). Any role
// with a password logs in with it and works as itself. A client keeps no
// session state across transactions and uses no named prepared
// statements there (pgx: default_query_exec_mode=cache_describe).
package testenv
