package topo

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// Concurrent table edits by compare-and-swap lose nothing, and the seed is
// untouchable.
func TestUpdateClusterCAS(t *testing.T) {
	ctx, z, s, p := zkCluster(t)
	if _, err := UpdateCluster(ctx, s, p, func(*ClusterRecord) error { return nil }); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("update of a missing cluster: %v", err)
	}
	// A format-1 record, as written before tables existed.
	v1 := `{"version":1,"name":"c1","seed":"abababababababababababababababab","created_at":"2026-01-02T03:04:05Z"}`
	if err := s.CreateAll(ctx, z.Root); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, p.Cluster(), []byte(v1)); err != nil {
		t.Fatal(err)
	}
	const writers = 8
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := UpdateCluster(ctx, s, p, func(r *ClusterRecord) error {
				r.Tables = append(r.Tables, TableRecord{Name: fmt.Sprintf("app.t%d", i), KeyColumn: "k"})
				return nil
			})
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	conflicts := 0
	for err := range errs {
		if !strings.Contains(err.Error(), "changed concurrently") {
			t.Fatal(err)
		}
		conflicts++ // possible under heavy contention; nothing half-written
	}
	r, err := ReadCluster(ctx, s, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Tables) != writers-conflicts || r.Version != 2 {
		t.Fatalf("%d tables (%d conflicts), version %d", len(r.Tables), conflicts, r.Version)
	}
	if _, err := UpdateCluster(ctx, s, p, func(r *ClusterRecord) error { r.Seed = "00112233445566778899aabbccddeeff"; return nil }); err == nil || !strings.Contains(err.Error(), "never change") {
		t.Fatalf("seed change: %v", err)
	}
	if _, err := UpdateCluster(ctx, s, p, func(r *ClusterRecord) error {
		r.Tables = append(r.Tables, r.Tables[0])
		return nil
	}); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Fatalf("duplicate table: %v", err)
	}
}
