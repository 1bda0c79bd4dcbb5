package testenv

import (
	"testing"

	"github.com/shardvisor/shardvisor/internal/devenv"
)

// PGBackRest is the managed environment's pgBackRest: the command that
// runs it (as the repository's owner) and its configuration, which names a
// stanza per db node (Stanza). Every managed server archives its WAL into
// that repository. It skips the test with SHARDVISOR_TEST_PG (external
// servers archive nowhere known).
func PGBackRest(t testing.TB) (command []string, config string) {
	t.Helper()
	if len(externalPG()) > 0 {
		t.Skip("testenv: external servers (SHARDVISOR_TEST_PG) have no pgBackRest stanza; this backup test is skipped")
	}
	if err := devenvDo("pgbackrest", nil, func(e *devenv.Env) error {
		command, config = e.PGBackRestCommand(), e.BackupConfig()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return command, config
}

// Stanza is the pgBackRest stanza of a managed node (a group's members
// share their node's).
func Stanza(n *PGNode) string { return devenv.New(devenv.Config{}).Stanza(n.number()) }
