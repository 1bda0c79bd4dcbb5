package deploy

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// Every alert's runbook_url lands on a section of docs/operations.md that
// names the alert, says its severity and gives a first step; and the doc
// names no alert the rules do not have (a renamed alert leaves no stale
// runbook behind).
func TestOperationsDocCoversEveryAlert(t *testing.T) {
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	sections := map[string]string{}
	heading := regexp.MustCompile(`(?m)^#### (Shardvisor\w+)\n`)
	locs := heading.FindAllStringSubmatchIndex(doc, -1)
	for i, l := range locs {
		end := len(doc)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		sections[doc[l[2]:l[3]]] = doc[l[1]:end]
	}
	alerts := map[string]bool{}
	for _, r := range load(t, rulesFile) {
		if r.Alert == "" {
			continue
		}
		alerts[r.Alert] = true
		body, ok := sections[r.Alert]
		if !ok {
			t.Errorf("%s: no section \"#### %s\" in docs/operations.md (its runbook_url points there)", r.Alert, r.Alert)
			continue
		}
		if want := fmt.Sprintf("**%s**", r.Labels["severity"]); !strings.Contains(body, want) {
			t.Errorf("%s: its section does not say %s", r.Alert, want)
		}
		if !strings.Contains(body, "First step:") {
			t.Errorf("%s: its section has no first step", r.Alert)
		}
	}
	for name := range sections {
		if !alerts[name] {
			t.Errorf("docs/operations.md has a section for %s, which no rule defines", name)
		}
	}
}
