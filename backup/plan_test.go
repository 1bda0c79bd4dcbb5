package backup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/hint"
)

func twoNodeMap(t *testing.T, level int) *bucketmap.Map {
	t.Helper()
	m, err := bucketmap.New(level, []bucketmap.Node{{ID: "a", DSN: "postgres://h1/app"}, {ID: "b", DSN: "postgres://h2/app"}}, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A bucket unchanged since the point is one piece, from its owner then to
// its owner now; moved since, it comes from the old owner into the new.
func TestPlanPiecesMoved(t *testing.T) {
	pm := twoNodeMap(t, 2)
	cur := pm.Clone()
	b := bucketmap.Bucket{Prefix: 0, Depth: 2}
	if err := cur.Assign(b, "b", bucketmap.AssignOptions{}); err != nil {
		t.Fatal(err)
	}
	lo, hi := b.Keys()
	got, err := planPieces(pm, cur, lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	want := []Piece{{Lo: lo, Hi: hi, From: "a", To: "b"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pieces %v, want %v", got, want)
	}
}

// A bucket split since the point, its halves now on two nodes: two
// pieces, both from the point's one owner, each into its half's owner.
func TestPlanPiecesSplitSince(t *testing.T) {
	pm := twoNodeMap(t, 1)
	cur := pm.Clone()
	b := bucketmap.Bucket{Prefix: 0, Depth: 1}
	if err := cur.SplitBucket(b); err != nil {
		t.Fatal(err)
	}
	h0, h1 := b.Halves()
	if err := cur.Assign(h1, "b", bucketmap.AssignOptions{}); err != nil {
		t.Fatal(err)
	}
	lo, hi := b.Keys()
	got, err := planPieces(pm, cur, lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	l0, h0hi := h0.Keys()
	l1, _ := h1.Keys()
	want := []Piece{{Lo: l0, Hi: h0hi, From: "a", To: "a"}, {Lo: l1, Hi: hi, From: "a", To: "b"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pieces %v, want %v", got, want)
	}
	// One half only: one piece.
	got, err = planPieces(pm, cur, l1, hi)
	if err != nil || len(got) != 1 || got[0] != (Piece{Lo: l1, Hi: hi, From: "a", To: "b"}) {
		t.Fatalf("half: %v, %v", got, err)
	}
}

// A bucket moving now is refused, naming the move.
func TestPlanPiecesMovingRefused(t *testing.T) {
	pm := twoNodeMap(t, 2)
	cur := pm.Clone()
	b := bucketmap.Bucket{Prefix: 1, Depth: 2}
	if err := cur.SetMoving(b, "b", "m42"); err != nil {
		t.Fatal(err)
	}
	lo, hi := b.Keys()
	if _, err := planPieces(pm, cur, lo, hi); err == nil || !strings.Contains(err.Error(), "m42") {
		t.Fatalf("got %v, want the move named", err)
	}
}

func TestCovered(t *testing.T) {
	spans := []fence.Span{{Lo: 0, Hi: 9, State: fence.Owned}, {Lo: 10, Hi: 19, State: fence.Owned}, {Lo: 20, Hi: 29, State: fence.Frozen}}
	for _, c := range []struct {
		lo, hi int64
		want   bool
	}{{0, 9, true}, {5, 15, true}, {0, 19, true}, {15, 25, false}, {20, 21, false}, {30, 31, false}} {
		if got := covered(spans, c.lo, c.hi); got != c.want {
			t.Errorf("covered(%d..%d) = %v, want %v", c.lo, c.hi, got, c.want)
		}
	}
}

func TestParseInfo(t *testing.T) {
	out := []byte(`[{"archive":[{"database":{"id":1,"repo-key":1},"id":"15-1","max":"000000010000000000000004","min":"000000010000000000000001"}],"backup":[{"archive":{"start":"000000010000000000000002","stop":"000000010000000000000002"},"backrest":{"format":5,"version":"2.45"},"database":{"id":1,"repo-key":1},"error":false,"info":{"delta":22992575,"repository":{"delta":4522362,"size":4522362},"size":22992575},"label":"20261130-084813F","lsn":{"start":"0/2000028","stop":"0/2000100"},"prior":null,"reference":null,"timestamp":{"start":1796028493,"stop":1796028498},"type":"full"}],"cipher":"none","db":[{"id":1,"repo-key":1,"system-id":7713883627741826905,"version":"15"}],"name":"s1","repo":[{"cipher":"none","key":1,"status":{"code":0,"message":"ok"}}],"status":{"code":0,"lock":{"backup":{"held":false}},"message":"ok"}}]`)
	si, err := parseInfo("s1", out)
	if err != nil {
		t.Fatal(err)
	}
	n := si.Newest()
	if n == nil || n.Label != "20261130-084813F" || n.Type != "full" || n.WALStart != "000000010000000000000002" || n.RepoSize != 4522362 || n.Stop.Unix() != 1796028498 {
		t.Fatalf("newest %+v", n)
	}
	if si.WALMin != "000000010000000000000001" || si.WALMax != "000000010000000000000004" || si.Status != "ok" {
		t.Fatalf("info %+v", si)
	}
	if _, err := parseInfo("other", out); err == nil {
		t.Fatal("a stanza not in the output must be an error")
	}
	if _, err := parseInfo("s1", []byte("not json")); err == nil {
		t.Fatal("garbage must be an error")
	}
}

// A point's WAL name is unique per cut and fits PostgreSQL's 63 bytes.
func TestWALName(t *testing.T) {
	at := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	a, b := WALName("before-deploy", at), WALName("before-deploy", at.Add(time.Millisecond))
	if a == b || !strings.HasPrefix(a, "before-deploy@") {
		t.Fatalf("%s %s", a, b)
	}
	if n := len(WALName(strings.Repeat("x", 48), at.AddDate(200, 0, 0))); n > 63 {
		t.Fatalf("WAL name of a 48-byte point is %d bytes", n)
	}
}

// Recovery never archives and stops at the target, promoting there.
func TestRestoreArgs(t *testing.T) {
	got := strings.Join(restoreArgs("/x/data", "F1", Target{Name: "p@1"}, []string{"app"}), " ")
	for _, w := range []string{"--pg1-path=/x/data", "--archive-mode=off", "--type=name", "--target=p@1", "--target-action=promote", "--db-include=app", "--set=F1"} {
		if !strings.Contains(got, w) {
			t.Errorf("%s lacks %s", got, w)
		}
	}
	got = strings.Join(restoreArgs("/x/data", "", Target{Time: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.FixedZone("x", 3600))}, nil), " ")
	if !strings.Contains(got, "--type=time") || !strings.Contains(got, "--target=2026-01-02 02:04:05.000006+00") {
		t.Errorf("time target: %s", got)
	}
}

// The metrics follow each check: a node's age, failing archiving and its
// problems; a failed point counts.
func TestMetricsStatus(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	past := time.Now().Add(-time.Hour)
	m.Status([]NodeStatus{
		{Node: "pg1", Newest: &BackupInfo{Label: "x"}, AgeSeconds: 3600, Archiver: &Archiver{Mode: "on"}},
		{Node: "pg2", Archiver: &Archiver{Mode: "on", LastFailedAt: &past}, Problems: []string{"archiving is failing", "no backup"}},
	})
	m.Point(nil)
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range mt.GetLabel() {
				name += "/" + l.GetValue()
			}
			got[name] = mt.GetGauge().GetValue() + mt.GetCounter().GetValue()
		}
	}
	want := map[string]float64{"shardvisor_backup_newest_age_seconds/pg1": 3600, "shardvisor_backup_archive_failing/pg1": 0, "shardvisor_backup_archive_failing/pg2": 1,
		"shardvisor_backup_problems/pg2": 2, "shardvisor_backup_problems/pg1": 0, "shardvisor_restore_point_failures_total": 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if _, ok := got["shardvisor_backup_newest_age_seconds/pg2"]; ok {
		t.Error("a node without a backup has an age")
	}
}

// A recovery starts from the newest backup that ended before its target:
// for a point older than the newest backup, an older one.
func TestChooseSet(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	info := &StanzaInfo{Stanza: "pg1", Backups: []BackupInfo{
		{Label: "F1", LSNStop: "0/2000100", Stop: t0},
		{Label: "I2", LSNStop: "0/5000100", Stop: t0.Add(time.Hour)},
		{Label: "I3", LSNStop: "1/0", Stop: t0.Add(2 * time.Hour), Error: true},
	}}
	for _, c := range []struct {
		t    Target
		want string
	}{
		{Target{Name: "p", LSN: "0/3044C70"}, "F1"},
		{Target{Name: "p", LSN: "0/6000000"}, "I2"},
		{Target{Name: "p", LSN: "2/0"}, "I2"},
		{Target{Time: t0.Add(30 * time.Minute)}, "F1"},
		{Target{Time: t0.Add(3 * time.Hour)}, "I2"},
		{Target{Name: "p"}, ""},
	} {
		got, err := ChooseSet(info, c.t)
		if err != nil || got != c.want {
			t.Errorf("ChooseSet(%v) = %q, %v; want %q", c.t, got, err, c.want)
		}
	}
	if _, err := ChooseSet(info, Target{Name: "p", LSN: "0/1000000"}); !errors.Is(err, ErrNoBackupBefore) {
		t.Errorf("a point before every backup: %v", err)
	}
	if _, err := ParseLSN("nope"); err == nil {
		t.Error("ParseLSN took nope")
	}
}

// A stanza locked by another pgBackRest process (error 50) is waited for,
// not failed at once; a lock held past LockWait fails, saying so.
func TestRunWaitsForTheStanzaLock(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "pgbackrest")
	// Locked for the first two calls, then it answers.
	if err := os.WriteFile(script, []byte(`#!/bin/sh
n=$(cat "$0.n" 2>/dev/null || echo 0); echo $((n + 1)) > "$0.n"
if [ "$n" -lt 2 ]; then echo "P00  ERROR: [050]: unable to acquire lock on file 'x.lock'" >&2; exit 50; fi
echo ok
`), 0o755); err != nil {
		t.Fatal(err)
	}
	b := PGBackRest{Command: []string{script}, LockWait: time.Minute}
	out, err := b.run(context.Background(), "pg1", "check")
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%q %v", out, err)
	}
	_ = os.Remove(script + ".n")
	b.LockWait = time.Millisecond
	if _, err := b.run(context.Background(), "pg1", "check"); err == nil || !strings.Contains(err.Error(), "waited") {
		t.Fatalf("a lock held past LockWait: %v", err)
	}
}

// A scratch server that stops on invalid pages says why and what to set;
// any other failed start keeps its log and no hint.
func TestStartFailedHint(t *testing.T) {
	log := "LOG: redo starts\nPANIC:  WAL contains references to invalid pages"
	err := startFailed("pg1", errors.New("exit status 1"), log)
	if !strings.Contains(err.Error(), "pg1") || !strings.Contains(err.Error(), "invalid pages") {
		t.Fatalf("error %q does not name the node and the log", err)
	}
	if h := hint.Of(err); !strings.Contains(h, "full_page_writes = on") {
		t.Fatalf("hint %q does not name full_page_writes", h)
	}
	other := startFailed("pg2", errors.New("exit status 1"), "FATAL: could not bind")
	if h := hint.Of(other); h != "" {
		t.Fatalf("a start failure of another cause has a hint: %q", h)
	}
}
