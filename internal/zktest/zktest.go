// Package zktest opens ZooKeeper sessions for tests. It is apart from
// testenv because zksession's own tests use testenv.
package zktest

import (
	"context"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/zksession"
)

// Session opens a ZooKeeper session for a test, waits until it is
// connected (up to 30 s) and closes it when the test ends.
func Session(t testing.TB, cfg zksession.Config) *zksession.Session {
	t.Helper()
	s, err := zksession.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}
