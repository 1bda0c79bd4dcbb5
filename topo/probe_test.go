package topo

import (
	"testing"
)

// A probe creates, reads back and deletes its scratch node, and leaves
// nothing behind; without the right to write it fails naming the step.
func TestProbe(t *testing.T) {
	ctx, z, s, p := zkCluster(t)
	steps, err := Probe(ctx, s, p, "probe-1")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, st := range steps {
		names = append(names, st.Step)
		if st.Path != p.Probe("probe-1") || st.Duration <= 0 {
			t.Errorf("step %+v: want path %s and a duration", st, p.Probe("probe-1"))
		}
	}
	if len(names) != 3 || names[0] != "create" || names[1] != "read" || names[2] != "delete" {
		t.Fatalf("steps %v, want create, read, delete", names)
	}
	if ok, _, err := s.Exists(ctx, p.Probe("probe-1")); err != nil || ok {
		t.Fatalf("scratch node left behind: exists=%v err=%v", ok, err)
	}

	// A closed session fails at the first step, and says which.
	s2 := z.Session(t)
	s2.Close()
	steps, err = Probe(ctx, s2, p, "probe-2")
	if err == nil || len(steps) != 0 || err.Error()[:len("create: ")] != "create: " {
		t.Fatalf("probe on a closed session: steps %v, err %v; want a create error", steps, err)
	}
}
