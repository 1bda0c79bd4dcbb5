package schema

import (
	"errors"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/topo"
)

func TestSplit(t *testing.T) {
	text := `-- leading comment; not a statement
CREATE TABLE a (x text DEFAULT 'a;b', "we;ird" int);
/* block ; /* nested ; */ still ; */
CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $fn$ SELECT 1; $fn$;
INSERT INTO a VALUES (E'it\'s; here', 1), ('it''s;', 2)  ;
SELECT $1::int -- a parameter, not a dollar quote
`
	got, err := Split(text)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		prefix string
		line   int
	}{{"CREATE TABLE a", 2}, {"CREATE FUNCTION", 4}, {"INSERT INTO a", 5}, {"SELECT $1", 6}}
	if len(got) != len(want) {
		t.Fatalf("%d statements: %+v", len(got), got)
	}
	for i, w := range want {
		if !strings.HasPrefix(stripLeadingComments(got[i].SQL), w.prefix) || got[i].Line != w.line {
			t.Errorf("statement %d: line %d %q; want line %d starting %q", i, got[i].Line, got[i].SQL, w.line, w.prefix)
		}
	}
	if !strings.Contains(got[1].SQL, "$fn$ SELECT 1; $fn$") {
		t.Errorf("the dollar-quoted body was cut: %q", got[1].SQL)
	}
	atomic, err := Split("CREATE FUNCTION f(x int) RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT CASE WHEN x > 0 THEN 1 ELSE 2 END; SELECT 3; END;\n" +
		"CREATE RULE r AS ON INSERT TO a DO ALSO (INSERT INTO b VALUES (1); INSERT INTO b VALUES (2));\nSELECT 4")
	if err != nil || len(atomic) != 3 || !strings.HasSuffix(atomic[0].SQL, "SELECT 3; END") || atomic[2].SQL != "SELECT 4" || atomic[2].Line != 3 {
		t.Fatalf("BEGIN ATOMIC and a rule's actions: %v %+v", err, atomic)
	}
	for _, bad := range []string{"SELECT 'open", `SELECT "open`, "SELECT $x$ open", "/* open /* */"} {
		if _, err := Split(bad); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("Split(%q): %v, want an error naming line 1", bad, err)
		}
	}
}

func TestParse(t *testing.T) {
	c, err := Parse("/x/007-add-note.sql", "ALTER TABLE app.kv ADD COLUMN note text DEFAULT 'x';\n")
	if err != nil || c.ID != "007-add-note" || c.Mode != topo.ModeTransaction || c.Statements != 1 || len(c.SHA256) != 64 {
		t.Fatalf("Parse: %+v %v", c, err)
	}
	c, err = Parse("any.sql", "-- shardvisor:id add-index\nCREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS \"Idx\" ON app.kv (v);\nANALYZE app.kv;")
	if err != nil || c.ID != "add-index" || c.Mode != topo.ModeStatements || !strings.Contains(c.NoTx, "line 2") {
		t.Fatalf("Parse of a concurrent index: %+v %v", c, err)
	}
	if name, table := concurrentIndex("CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS \"Idx\" ON app.kv (v)"); name != "Idx" || table != "app.kv" {
		t.Errorf("concurrentIndex: %q on %q", name, table)
	}
	if name, table := concurrentIndex("create index concurrently MyIdx on only \"A\".t using btree (v)"); name != "myidx" || table != `"A".t` {
		t.Errorf("concurrentIndex: %q on %q", name, table)
	}
	for _, tc := range []struct{ file, text, want string }{
		{"a.sql", "BEGIN; ALTER TABLE t ADD c int; COMMIT;", "BEGIN is not allowed"},
		{"a.sql", "ALTER TABLE t ADD c int;\n  start transaction;", "line 2: START TRANSACTION"},
		{"a.sql", "-- nothing\n", "holds no SQL"},
		{"bad name!.sql", "SELECT 1", "is invalid"},
		{"a.sql", "SELECT 'x", "never closed"},
		{"a.sql", "CREATE INDEX CONCURRENTLY ON app.kv (v);", "needs an index name"},
	} {
		if _, err := Parse(tc.file, tc.text); !errors.Is(err, ErrBadChange) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): %v, want %q", tc.text, err, tc.want)
		}
	}
	for _, s := range []string{"VACUUM app.kv", "create database x", "DROP INDEX CONCURRENTLY i", "REINDEX (VERBOSE) TABLE CONCURRENTLY t", "ALTER SYSTEM SET x = 1", "ALTER TABLE p DETACH PARTITION p1 CONCURRENTLY"} {
		if _, ok := outsideTransaction(s); !ok {
			t.Errorf("%q should run outside a transaction", s)
		}
	}
	if _, ok := outsideTransaction("CREATE INDEX i ON t (x)"); ok {
		t.Error("a plain CREATE INDEX runs in a transaction")
	}
}

func TestCleanDump(t *testing.T) {
	dump := "\\restrict abc\nSET lock_timeout = 0;\nCREATE TABLE public.t (k bigint);\nALTER TABLE ONLY public.t\n    ADD CONSTRAINT zz_shardvisor_fence CHECK (true) NOT VALID;\n" +
		"CREATE TRIGGER zz_shardvisor_fence BEFORE DELETE ON public.t FOR EACH ROW EXECUTE FUNCTION shardvisor.f();\nCOMMENT ON EXTENSION x IS 'y';\n\\unrestrict abc\n"
	got, err := CleanDump(dump)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(got, "zz_shardvisor") || strings.Contains(got, `\`) || strings.Contains(got, "COMMENT ON EXTENSION") || !strings.Contains(got, "CREATE TABLE public.t") {
		t.Fatalf("cleaned dump:\n%s", got)
	}
	if _, err := CleanDump("\\connect other\n"); err == nil {
		t.Fatal("a psql command other than \\restrict was kept")
	}
}

func FuzzSplit(f *testing.F) {
	for _, s := range []string{"SELECT 1; SELECT 2", "SELECT 'a;'; $$;$$", "/* ; */ x; -- ;\n y", "E'\\';'; z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		stmts, err := Split(s)
		if err != nil {
			return
		}
		// Every statement is found again, in order, in the text.
		at := 0
		for _, st := range stmts {
			i := strings.Index(s[at:], st.SQL)
			if i < 0 || st.Line < 1 {
				t.Fatalf("statement %q (line %d) not in the text after %d", st.SQL, st.Line, at)
			}
			at += i + len(st.SQL)
		}
	})
}
