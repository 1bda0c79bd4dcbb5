package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/schema"
	"github.com/shardvisor/shardvisor/topo"
)

// schema apply's text output says, under a node's error, what to run about
// it (NodeResult.Hint), as the error itself did before the hints left the
// messages; --json has it as the node's "hint".
func TestWriteApplyShowsANodesHint(t *testing.T) {
	const h = "if the node is in step, `shardctl schema adopt --from NODE` (a node with the whole history) records it"
	var b bytes.Buffer
	writeApply(&b, &schema.Result{ID: "002-idx", Seq: 2, Mode: "tx", State: topo.SchemaPartial, Missing: []string{"pg2"},
		Nodes: []schema.NodeResult{
			{Node: "pg1", State: "applied"},
			{Node: "pg2", State: "failed", Error: `ERROR: relation "kv_v" already exists (SQLSTATE 42P07)`, Hint: h},
		}})
	out := b.String()
	if !strings.Contains(out, "already exists") || !strings.Contains(out, "hint: "+h) {
		t.Errorf("output without the node's error and hint:\n%s", out)
	}
	if strings.Count(out, "hint: ") != 1 {
		t.Errorf("a hint for a node without one:\n%s", out)
	}
}
