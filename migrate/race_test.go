//go:build race

package migrate

import "testing"

// skipUnderRace skips a test that makes a ZooKeeper client reconnect while
// it holds watches: go-zookeeper v1.0.4 races on its lastZxid after such a
// reconnect (a library bug, see zksession's tests). `make test` runs these
// tests without -race.
func skipUnderRace(t *testing.T) {
	t.Skip("reconnects with watches: go-zookeeper v1.0.4 races on lastZxid (library bug); run without -race")
}
