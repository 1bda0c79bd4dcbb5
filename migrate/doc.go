// Package migrate moves a bucket's rows between PostgreSQL db nodes online,
// and drives the planner's moves (the rebalancer).
//
// A move is a crash-safe state machine whose state lives in a ZooKeeper
// move record, advanced step by step; every step is idempotent, so a mover
// killed at any point resumes or rolls back cleanly when run again. Its
// states are topo's (topo.MoveStates), and topo.MoveTransitions lists the
// legal changes between them, which the mover checks at each one:
//
//	prepare      schemas compared (source vs target), target range marked
//	             incoming, leftovers cleared
//	copy         logical replication with a row filter on the bucket's
//	             key range
//	catchup      marker round trip below the lag threshold, else no fence
//	             (a rollback move starts here)
//	fence        map says moving; every router and supervisor has seen it,
//	             or Options.MemberWait ran out (the rest are recorded as
//	             stragglers); the source range is frozen (its writers
//	             drained)
//	barrier      a marker committed after the freeze is applied on the
//	             target
//	flip         target owns the range; the map gives it the bucket (CAS);
//	             the source releases it
//	teardown     subscription, publication and slot dropped
//	reverse      the reverse stream (target back to source) starts
//	verify       row counts and checksums compared on both nodes
//	reversible   the rollback window: `move rollback` gives the bucket back
//	             with every write made since the flip
//	completing   the reverse stream dropped (`move complete`, or the
//	             window's end)
//	done         finished on the target
//	aborting     rolling back before the flip: the source owns the range
//	             again, the target's partial copy is removed
//	aborted      rolled back before the flip
//	rolled_back  given back after the flip, by a rollback move
//	failed       verification found a difference and no rollback was
//	             possible: a person decides (`move abort --after-failure`)
//
// The write pause runs from the freeze to the map flip (pause.go). A move
// that cannot flip within Options.PauseCap is aborted: the source owns the
// range again and the target's partial copy is removed.
package migrate
