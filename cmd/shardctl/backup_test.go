package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

// The backup commands end to end, as an operator drives them: a node
// without a stanza is a problem once backups are configured (node check
// fails, naming what to run), a backup clears it, a restore point is
// listed and shown with each node's recovery command, and a bucket's
// deleted rows come back with `restore --mode missing` (a dry run first
// that changes nothing), keeping a row written since.
func TestLongBackupCommands(t *testing.T) {
	testenv.Long(t)
	z := testenv.StartZK(t)
	pg := testenv.StartPGNodes(t, 2)
	cmd := initCluster(t, z, pg, "bk", 3, 2, func(int) string { return eventsDDL })
	prepareTable(t, cmd, "app.events", 2)
	pgbr, cfg := testenv.PGBackRest(t)
	t.Setenv("SHARDVISOR_PGBACKREST", strings.Join(pgbr, " "))
	t.Setenv("SHARDVISOR_PGBACKREST_CONFIG", cfg)
	scratch, err := os.MkdirTemp("", "shardctl-scratch-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(scratch, 0o755)
	t.Cleanup(func() { os.RemoveAll(scratch) })
	t.Setenv("SHARDVISOR_SCRATCH_DIR", scratch)
	ctx := context.Background()
	c1 := pg.Nodes[0].Conn(t)
	// Bucket 1 is pg1's (level 3, two nodes: pg1 holds 0..3).
	lo := int64(-6917529027641081856)
	if _, err := c1.Exec(ctx, `INSERT INTO app.events (bkey, id) SELECT $1::bigint + g, g FROM generate_series(1, 50) g`, lo); err != nil {
		t.Fatal(err)
	}

	// Configured for pg1 only: pg2 is a problem, node check says so.
	mustData(t, cmd("backup", "configure", "pg1", "--stanza", testenv.Stanza(pg.Nodes[0]))...)
	r := runData(t, cmd("node", "check", "pg2")...)
	if r.code != 1 || !strings.Contains(r.stdout, "no backups configured for this node (shardctl backup configure pg2") {
		t.Fatalf("node check of pg2 without a stanza: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	mustData(t, cmd("backup", "configure", "pg2", "--stanza", testenv.Stanza(pg.Nodes[1]))...)
	mustData(t, cmd("backup", "pg1", "pg2")...)
	var list struct {
		Nodes []struct {
			Node     string   `json:"node"`
			Problems []string `json:"problems"`
			Backups  []struct {
				Label    string `json:"label"`
				WALStart string `json:"wal_start"`
			} `json:"backups_list"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(mustData(t, cmd("backup", "list", "--json")...)), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Nodes) != 2 || len(list.Nodes[0].Backups) == 0 || list.Nodes[0].Backups[0].WALStart == "" || len(list.Nodes[0].Problems)+len(list.Nodes[1].Problems) > 0 {
		t.Fatalf("backup list: %+v", list)
	}
	if out := mustData(t, cmd("node", "check", "pg1")...); !strings.Contains(out, "archiving: on") {
		t.Fatalf("node check of pg1 does not show its archiving:\n%s", out)
	}

	out := mustData(t, cmd("restore-point", "create", "before")...)
	if !strings.Contains(out, "before") || !strings.Contains(out, "node pg1: LSN") {
		t.Fatalf("restore-point create:\n%s", out)
	}
	if r := runData(t, cmd("restore-point", "create", "before")...); r.code != 1 || !strings.Contains(r.stderr, "restore-point delete before") {
		t.Fatalf("a second point of a name: exit %d %s", r.code, r.stderr)
	}
	if out := mustData(t, cmd("restore-point", "show", "before", "--data-dir", "/srv/{node}")...); !strings.Contains(out, "--pg1-path=/srv/pg1") || !strings.Contains(out, "--target=before@") {
		t.Fatalf("restore-point show:\n%s", out)
	}
	time.Sleep(10 * time.Millisecond)
	// A backup after the point: a restore to the point must start from
	// the one before (pgBackRest's own choice, the newest, ends the
	// recovery before the point).
	mustData(t, cmd("backup", "pg1")...)
	// The mistake, then a row written after it.
	if _, err := c1.Exec(ctx, `DELETE FROM app.events WHERE bkey BETWEEN $1::bigint AND $1::bigint + 25`, lo); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Exec(ctx, `INSERT INTO app.events (bkey, id) VALUES ($1::bigint + 1000, 1000)`, lo); err != nil {
		t.Fatal(err)
	}
	count := func() (n int) {
		if err := c1.QueryRow(ctx, `SELECT count(*) FROM app.events WHERE bkey BETWEEN $1::bigint AND $1::bigint + 1000`, lo).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 26 {
		t.Fatalf("after the mistake: %d rows", n)
	}
	out = mustData(t, cmd("restore", "1", "--to", "before", "--mode", "missing", "--dry-run")...)
	if !strings.Contains(out, "25 rows come back") || count() != 26 {
		t.Fatalf("dry run (%d rows now):\n%s", count(), out)
	}
	out = mustData(t, cmd("restore", "1", "--to", "before", "--mode", "missing")...)
	if n := count(); n != 51 {
		t.Fatalf("after the restore: %d rows, want the 50 back and the one since\n%s", n, out)
	}
	if r := runData(t, cmd("restore", "1", "--to", "nope")...); r.code != 1 || !strings.Contains(r.stderr, "no restore point nope") || !strings.Contains(r.stderr, "restore-point list") {
		t.Fatalf("an unknown point: exit %d %s", r.code, r.stderr)
	}
	if r := runData(t, cmd("restore", "1", "--to", "2026-11-30 08:00")...); r.code != 2 || !strings.Contains(r.stderr, "RFC 3339") {
		t.Fatalf("a malformed time: exit %d %s", r.code, r.stderr)
	}
}
