// Package zksession is shardvisor's one way to talk to ZooKeeper: a process
// opens one Session and every component (supervisor, router, shardctl, the
// mover) shares it.
//
// It wraps github.com/go-zookeeper/zk v1.0.4 and removes that library's
// sharp edges:
//
//   - Events: the library drops events when its 6-slot channel is full. We
//     take every event through its synchronous callback and fold it into
//     sticky state, so nothing that matters (an expiry) can be dropped.
//   - Timeouts: no library call has one, and calls made while disconnected
//     queue. Every call here is bounded by a context and Config.OpTimeout.
//   - Expiry is only seen on reconnect. We run our own heartbeat and declare
//     the session lost when no call has succeeded for 2/3 of the negotiated
//     session timeout, which is before the server may expire it.
//   - Reconnects: the server order is shuffled and jitter is added to the
//     library's fixed pause after a full pass over the servers.
//   - The negotiated session timeout is not exported by the library; it is
//     read from the server's connect response by a wrapping dialer.
//
// # States
//
// A Session is always in one of:
//
//   - Connected: it has a session and calls succeed. Writes are allowed.
//   - Suspended: disconnected, or no call has succeeded for 1/3 of the
//     session timeout. The session may still be alive: serve cached data, but
//     writes are refused with ErrNotConnected so nothing that changes
//     ownership happens on a possibly stale view.
//   - Lost: no session (before the first one, after expiry), or no call has
//     succeeded for 2/3 of the session timeout. Whatever this process holds
//     in ZooKeeper (ephemeral nodes, locks) must be considered gone.
//   - Closed: Close was called.
//
// Subscribe delivers every state change; TimeInState reports the time spent
// in each. On every return to Connected the session re-creates its
// registered ephemeral nodes (checking their EphemeralOwner) and every Watch
// re-reads its node.
//
// # Paths
//
// A connect string may end in a chroot ("h1:2181,h2:2181/apps"), as in the
// Java client. The library does not support chroots, so this package
// prefixes every path itself; callers always use paths relative to the
// chroot.
package zksession
