package fence

import (
	"regexp"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/topo"
)

var (
	sqlComment  = regexp.MustCompile(`--[^\n]*`)
	sqlString   = regexp.MustCompile(`'(?:[^']|'')*'`)
	qualifiedOp = regexp.MustCompile(`OPERATOR\(pg_catalog\.[^)]+\)`)
	castTo      = regexp.MustCompile(`::\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)`)
	callOf      = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_.]*)\s*\(`)
	raiseOption = regexp.MustCompile(`\b(ERRCODE|MESSAGE|DETAIL|HINT)\s*=`) // RAISE ... USING, not an operator
	// constructs that look like calls but are not looked up by name
	notFunctions = map[string]bool{"COALESCE": true, "AND": true, "OR": true, "NOT": true, "IF": true, "ELSIF": true, "THEN": true, "IN": true}
)

// Every function the fence installs must mean the same whatever the
// caller's search_path: every operator written OPERATOR(pg_catalog.x),
// every function and cast qualified. (The pinned search_path would cover a
// slip; this keeps the bodies honest without it.)
func TestFunctionBodiesAreQualified(t *testing.T) {
	fns := append([]function{}, sharedFunctions...)
	fns = append(fns, tableFunction(events), tableFunction(topo.TableRecord{Name: "app.odd", KeyColumn: "Key Col"}))
	for _, f := range fns {
		body := sqlComment.ReplaceAllString(f.body, "")
		body = sqlString.ReplaceAllString(body, "''")
		for _, m := range castTo.FindAllStringSubmatch(body, -1) {
			if !strings.HasPrefix(m[1], "pg_catalog.") {
				t.Errorf("%s: cast %q is not to a pg_catalog type", f.name, m[0])
			}
		}
		for _, m := range callOf.FindAllStringSubmatch(body, -1) {
			name := m[1]
			if !strings.HasPrefix(name, "pg_catalog.") && !strings.HasPrefix(name, "shardvisor.") && name != "OPERATOR" && !notFunctions[strings.ToUpper(name)] {
				t.Errorf("%s: call %q is not qualified", f.name, m[0])
			}
		}
		rest := qualifiedOp.ReplaceAllString(body, " ")
		rest = raiseOption.ReplaceAllString(rest, " ")
		rest = strings.NewReplacer(":=", " ", "::", " ").Replace(rest)
		if i := strings.IndexAny(rest, "<>=+-*/%!~^&|#@"); i >= 0 {
			t.Errorf("%s: unqualified operator near %q", f.name, rest[max(0, i-30):min(len(rest), i+30)])
		}
		if !strings.Contains(f.createSQL(), "SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $fn$") {
			t.Errorf("%s: search_path not pinned: %s", f.name, f.createSQL()[:120])
		}
	}
}
