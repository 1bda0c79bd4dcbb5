package bucketmap

import (
	"strings"
	"testing"
)

func TestGridGroupsRangesAtHighLevels(t *testing.T) {
	m := bump(mustNew(t, 10, nodes(3))) // 1024 buckets: 342, 341, 341
	if err := m.SetMoving(at(m, 0), "n2", "mv-1"); err != nil {
		t.Fatal(err)
	}
	if err := m.Assign(at(m, 1023), "n1", AssignOptions{NoCopy: true}); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	m.Grid(&b, 32)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 1+32+1 {
		t.Fatalf("%d lines:\n%s", len(lines), b.String())
	}
	if f := strings.Fields(lines[0]); len(f) != 4 || f[0] != "buckets" || f[1] != "n1" {
		t.Fatalf("header %q", lines[0])
	}
	// Row 0 (buckets 0-31) is n1's, with one bucket moving in to n2.
	if f := strings.Fields(lines[1]); f[0] != "0-31" || f[1] != "#" || f[2] != ">" || f[3] != "." {
		t.Fatalf("row 0 %q", lines[1])
	}
	// Row 10 (320-351) is split: n1 owns 320..341 (22), n2 the rest (10).
	if f := strings.Fields(lines[11]); f[0] != "320-351" || f[1] != "22" || f[2] != "10" {
		t.Fatalf("row 10 %q", lines[11])
	}
	// The last row has n1's reassigned, data-lost bucket.
	if f := strings.Fields(lines[32]); f[1] != "1!" || f[3] != "31" {
		t.Fatalf("last row %q", lines[32])
	}
}

func TestSummarize(t *testing.T) {
	m := bump(mustNew(t, 3, []Node{node("a", 3), node("b", 1)}))
	s := m.Summarize()
	if s.Buckets != 8 || s.Nodes[0].Buckets != 6 || s.Nodes[0].FairShare != 0.75 || !s.Balanced || len(s.Flagged) != 0 {
		t.Fatalf("%+v", s)
	}
	if err := m.AddNode(node("c", 4)); err != nil {
		t.Fatal(err)
	}
	if s := m.Summarize(); s.Balanced {
		t.Fatal("a map with an empty active node reported balanced")
	}
	var b strings.Builder
	WriteSummary(&b, m.Summarize())
	if !strings.Contains(b.String(), "NOT balanced") {
		t.Fatalf("summary:\n%s", b.String())
	}
}

func TestParseSimEvent(t *testing.T) {
	for in, want := range map[string]SimEvent{
		"add:n4":     {Kind: "add", Node: "n4", Weight: 1},
		"add:n4=3":   {Kind: "add", Node: "n4", Weight: 3},
		"weight:a=2": {Kind: "weight", Node: "a", Weight: 2},
		"down:n2":    {Kind: "down", Node: "n2"},
		"split":      {Kind: "split"},
	} {
		if got, err := ParseSimEvent(in); err != nil || got != want {
			t.Errorf("%s: %+v %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "add", "add:", "boom:n1", "weight:a", "add:n4=x", "down:n2=3", "add:a=0"} {
		if _, err := ParseSimEvent(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
