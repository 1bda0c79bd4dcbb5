package topo

import (
	"errors"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testkit"
)

func TestBackupRecordsMalformed(t *testing.T) {
	testkit.WantMalformed(t, ErrMalformed, "DecodeBackupConfig", DecodeBackupConfig, "backup configuration", "/shardvisor/c1/backup", []testkit.Malformed{
		{`{"version":1,"stanzas":{"pg1":"bad stanza"}}`, "stanza"},
		{`{"version":1,"stanzas":{},"max_age":"soon"}`, "max_age"},
		{`{"version":1,"stanzas":{},"max_age":"-1h"}`, "max_age"},
		{`{"version":2,"stanzas":{}}`, "format version 2"},
		{`{"version":1,"stanzas":{},"x":1}`, `unknown field "x"`},
	})
	testkit.WantMalformed(t, ErrMalformed, "DecodeRestorePoint", DecodeRestorePoint, "restore point", "/shardvisor/c1/backup/points/p", []testkit.Malformed{
		{`{"version":1,"name":"p q","wal_name":"x","at":"2026-11-30T00:00:00Z","nodes":{"a":{"lsn":"0/1"}}}`, "invalid"},
		{`{"version":1,"name":"p","wal_name":"x","nodes":{"a":{"lsn":"0/1"}}}`, "no time"},
		{`{"version":1,"name":"p","at":"2026-11-30T00:00:00Z","nodes":{"a":{"lsn":"0/1"}}}`, "wal_name"},
		{`{"version":1,"name":"p","wal_name":"x","at":"2026-11-30T00:00:00Z","nodes":{}}`, "no nodes"},
		{`{"version":1,"name":"p","wal_name":"x","at":"2026-11-30T00:00:00Z","nodes":{"a":{}}}`, "no LSN"},
	})
	testkit.WantMalformed(t, ErrMalformed, "DecodeBucketRestore", DecodeBucketRestore, "bucket restore", "/shardvisor/c1/backup/restores/r", []testkit.Malformed{
		{`{"version":1,"id":"r","bucket":"1","mode":"all"}`, "mode"},
		{`{"version":1,"id":"","bucket":"1","mode":"replace"}`, "no id"},
	})
}

// A restore point and its map are written together; a second point of
// the name is refused; the list is oldest first; delete forgets both.
func TestRestorePointRecords(t *testing.T) {
	ctx, _, s, p := zkCluster(t)
	clusterNode(t, ctx, s, p)
	mk := func(name string, at time.Time) *RestorePoint {
		return &RestorePoint{Version: RestorePointVersion, Name: name, WALName: name + "@1", At: at, Reason: "manual", MapVersion: 7,
			Nodes: map[string]PointNode{"pg1": {LSN: "0/1", Timeline: 1, Stanza: "pg1"}}}
	}
	t0 := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	if err := CreateRestorePoint(ctx, s, p, mk("late", t0.Add(time.Minute)), []byte("map-late")); err != nil {
		t.Fatal(err)
	}
	if err := CreateRestorePoint(ctx, s, p, mk("early", t0), []byte("map-early")); err != nil {
		t.Fatal(err)
	}
	if err := CreateRestorePoint(ctx, s, p, mk("early", t0), []byte("x")); !errors.Is(err, ErrPointExists) {
		t.Fatalf("second point of a name: %v, want ErrPointExists", err)
	}
	pts, err := ListRestorePoints(ctx, s, p)
	if err != nil || len(pts) != 2 || pts[0].Name != "early" || pts[1].Name != "late" {
		t.Fatalf("list %v %v", pts, err)
	}
	if m, err := ReadRestorePointMap(ctx, s, p, "early"); err != nil || string(m) != "map-early" {
		t.Fatalf("map %q %v", m, err)
	}
	if err := DeleteRestorePoint(ctx, s, p, "early"); err != nil {
		t.Fatal(err)
	}
	if pts, _ := ListRestorePoints(ctx, s, p); len(pts) != 1 {
		t.Fatalf("after delete: %v", pts)
	}
	c, err := UpdateBackupConfig(ctx, s, p, func(c *BackupConfig) error { c.Stanzas["pg1"] = "pg1"; return nil })
	if err != nil || c.Stanzas["pg1"] != "pg1" {
		t.Fatal(c, err)
	}
	if c, v, err := ReadBackupConfig(ctx, s, p); err != nil || v < 0 || c.Stanzas["pg1"] != "pg1" || c.MaxAgeOrDefault() != DefaultBackupMaxAge {
		t.Fatal(c, v, err)
	}
}
