//go:build race

package sidecar

import "testing"

// skipUnderRace skips a test that makes ZooKeeper clients reconnect while
// they hold watches: go-zookeeper v1.0.4 (the pinned client) races on its
// lastZxid between sendSetWatches and recvLoop after every such reconnect,
// which the race detector reports as a failure of whatever test is running.
// `make test` runs these tests again without -race.
func skipUnderRace(t *testing.T) {
	t.Skip("reconnects with watches: go-zookeeper v1.0.4 races on lastZxid (library bug); run without -race by make test")
}
