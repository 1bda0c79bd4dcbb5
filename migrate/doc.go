// Package migrate moves a bucket's rows between PostgreSQL db nodes online,
// and drives the planner's moves (the rebalancer).
//
// A move is a crash-safe state machine whose state lives in a ZooKeeper
// move record, advanced step by step; every step is idempotent, so a mover
// killed at any point resumes or rolls back cleanly when run again:
//
//	prepare   schemas compared (source vs target), target range marked
//	          incoming, leftovers cleared
//	copy      logical replication with a row filter on the bucket's key range
//	catchup   marker round trip below the lag threshold, else no fence
//	fence     map says moving; every router and supervisor has seen it,
//	          or Options.MemberWait ran out (the rest are recorded as
//	          stragglers); the source range is frozen (its writers drained)
//	barrier   a marker committed after the freeze is applied on the target
//	flip      target owns the range; the map gives it the bucket (CAS);
//	          the source releases it
//	teardown  subscription, publication and slot dropped
//	verify    row counts and checksums compared on both nodes
//
// The write pause runs from the freeze to the map flip. A move that cannot
// flip within Options.PauseCap is aborted: the source owns the range again
// and the target's partial copy is removed.
package migrate
