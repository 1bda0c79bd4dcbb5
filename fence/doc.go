// Package fence is the write fence that keeps stale writers off db nodes
// that do not own a row's bucket, and the sharded-table contract it relies
// on. It is public so that applications can recognise a fenced write
// (IsRejected, SQLState) and so that the mover can build on its flips.
//
// # On each db node
//
// `shardctl node prepare` (Install + Sync) creates, in schema shardvisor:
//
//   - ownership(lo, hi, state, epoch): the key ranges (inclusive bounds in
//     the storage encoding of keystream.Key) this node may write, as few
//     rows as possible (adjacent ranges of one state are merged), each
//     owned, frozen or incoming since map version epoch. Rows never
//     overlap (an exclusion constraint says so).
//   - fence_meta: the cluster and node the database belongs to and the
//     newest map version applied.
//   - on every sharded table: the NOT VALID CHECK constraint
//     zz_shardvisor_fence, calling check_row(key, tableoid), which checks
//     the row as stored (INSERT, COPY, the new row of an UPDATE) after
//     every BEFORE trigger; the BEFORE UPDATE OR DELETE row trigger
//     zz_shardvisor_fence for old keys; the AFTER UPDATE trigger
//     zz_shardvisor_fence_final for a row whose key a later BEFORE trigger
//     moved; and the TRUNCATE guard zz_shardvisor_truncate_guard. A write
//     to a key outside an owned range fails with SQLSTATE SV001, a fenced
//     write above READ COMMITTED with SV002, a TRUNCATE with SV003.
//   - owns(key), which applications add to UPDATE and DELETE so that one
//     on a node that does not own the key fails even when no row matches.
//
// Every function pins search_path and qualifies every name, and runs as
// the writer (SECURITY INVOKER): docs/data-contract.md, "Security model",
// says against whom the fence holds and why.
//
// Plain triggers do not fire when session_replication_role is replica, and
// check_row lets such sessions through: that is how logical-replication
// apply and GC's deletes run. The fence stops applications, not the
// machinery that moves and prunes rows.
//
// # Draining
//
// The trigger and check_row take the row's lock granule (its bucket at
// LockLevel) with pg_advisory_xact_lock_shared before they read the
// ownership table; every flip (Sync, SetState and its wrappers Freeze,
// SetIncoming, Own, Release) takes the granules of the ranges that stop
// being owned with pg_advisory_xact_lock, exclusively, before it changes a
// row. So a flip waits for the writers in flight, and writers that come
// later wait for the flip and then, because at READ COMMITTED each
// statement takes a new snapshot, see its result. The granule level is
// fixed, so lock identities do not change when the map splits; see
// docs/data-contract.md.
//
// # Versions
//
// Each flip carries the map version it belongs to. The fence remembers the
// newest it applied and refuses older ones (ErrStale), so a slow admin with
// an old map cannot undo a newer change.
package fence
