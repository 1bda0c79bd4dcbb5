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
//   - on every sharded table, a BEFORE INSERT OR UPDATE OR DELETE row
//     trigger, zz_shardvisor_fence, that rejects (SQLSTATE SV001) a write
//     whose bucket key is not in an owned range, and (SV002) a fenced
//     write above READ COMMITTED.
//
// Plain triggers do not fire when session_replication_role is replica,
// which is how logical-replication apply and GC's deletes run: the fence
// stops applications, not the machinery that moves and prunes rows.
//
// # Draining
//
// The trigger takes the row's lock granule (its bucket at LockLevel) with
// pg_advisory_xact_lock_shared before it reads the ownership table; every
// flip (Sync, SetState and its wrappers Freeze, SetIncoming, Own, Release)
// takes the granules of the ranges that stop being owned with
// pg_advisory_xact_lock, exclusively, before it changes a row. So a flip
// waits for the writers in flight, and writers that come later wait for
// the flip and then, because at READ COMMITTED each statement takes a new
// snapshot, see its result. The granule level is fixed, so lock identities
// do not change when the map splits; see docs/data-contract.md.
//
// # Versions
//
// Each flip carries the map version it belongs to. The fence remembers the
// newest it applied and refuses older ones (ErrStale), so a slow admin with
// an old map cannot undo a newer change.
package fence
