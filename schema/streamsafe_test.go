package schema

import (
	"strings"
	"testing"
)

func TestStreamSafe(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		safe bool
		why  string // part of the reason when not safe
	}{
		{"ALTER TABLE kv ADD COLUMN note text", true, ""},
		{"alter table if exists only public.kv add column if not exists n int NOT NULL DEFAULT 0", true, ""},
		{"ALTER TABLE kv ADD COLUMN a int, ADD COLUMN b text DEFAULT 'x, unique'", true, ""},
		{"ALTER TABLE kv ADD COLUMN d numeric(10,2) DEFAULT -1.5::numeric(10,2) NULL", true, ""},
		{"ALTER TABLE kv ADD COLUMN t timestamp with time zone, ADD c varchar(20)[] COLLATE \"C\" DEFAULT 'x'", true, ""},
		{"-- a note\nCREATE INDEX CONCURRENTLY kv_note ON kv (note)", true, ""},
		{"CREATE INDEX kv_v ON ONLY app.kv USING btree (v DESC NULLS LAST, uid text_pattern_ops) INCLUDE (note); COMMENT ON COLUMN kv.v IS 'drop column v'; ANALYZE kv", true, ""},
		{`ALTER TABLE "drop" ADD COLUMN "check" int`, true, ""},

		{"ALTER TABLE kv DROP COLUMN v", false, "line 1: ALTER TABLE ... DROP COLUMN is not an addition"},
		{"ALTER TABLE kv ADD COLUMN a int, DROP COLUMN v", false, "DROP COLUMN"},
		{"ALTER TABLE kv ALTER COLUMN v TYPE bigint", false, "ALTER COLUMN"},
		{"ALTER TABLE kv RENAME COLUMN v TO w", false, "RENAME COLUMN"},
		{"ALTER TABLE kv ADD CONSTRAINT v_pos CHECK (v > 0)", false, "ADD of a constraint"},
		{"ALTER TABLE kv ADD COLUMN o int REFERENCES other (id)", false, "REFERENCES"},
		{"ALTER TABLE kv ADD COLUMN u int UNIQUE", false, "UNIQUE"},
		{"ALTER TABLE kv ADD PRIMARY KEY (k)", false, "ADD of a constraint"},
		{"CREATE UNIQUE INDEX kv_u ON kv (v)", false, "CREATE UNIQUE INDEX"},
		{"CREATE TABLE t2 (k bigint)", false, "CREATE TABLE"},
		{"CREATE INDEX i ON kv (v);\n\nDROP TABLE kv", false, "line 3: DROP TABLE"},
		{"UPDATE kv SET v = 0", false, "UPDATE"},
		{"ALTER TABLE kv", false, "without an action"},
		{"SET lock_timeout = '1s'", false, "SET"},
		{"SET session_replication_role = replica", false, "SET"},
		// Values each node would compute for itself.
		{"ALTER TABLE kv ADD COLUMN d numeric DEFAULT round(1.5, 1)", false, "not a constant"},
		{"ALTER TABLE kv ADD COLUMN tok uuid DEFAULT gen_random_uuid()", false, "not a constant"},
		{"ALTER TABLE kv ADD COLUMN at timestamptz DEFAULT now()", false, "not a constant"},
		{"ALTER TABLE kv ADD COLUMN n bigserial", false, "bigserial"},
		{"ALTER TABLE kv ADD COLUMN n bigint GENERATED ALWAYS AS IDENTITY", false, "identity"},
		{"ALTER TABLE kv ADD COLUMN n int NOT NULL", false, "NOT NULL without a DEFAULT"},
		{"CREATE INDEX kv_inv ON app.kv ((1 / v))", false, "expression"},
		{"CREATE INDEX kv_p ON app.kv (v) WHERE v > 0", false, "WHERE"},
		// Texts a keyword scan reads differently from PostgreSQL (review
		// of issue 40): each drops a column.
		{"ALTER TABLE app.kv ADD COLUMN a name DEFAULT name'x\\', DROP COLUMN v, ADD COLUMN b text DEFAULT '--'\n", false, "backslash"},
		{"ALTER TABLE app.kv ADD COLUMN a$$ int, DROP COLUMN v, ADD COLUMN b$$ int", false, "DROP COLUMN"},
		{"SET standard_conforming_strings = off;\nALTER TABLE app.kv ADD COLUMN a text DEFAULT 'x\\' --', DROP COLUMN v\n", false, "backslash"},
		{"ALTER TABLE kv ADD COLUMN x text DEFAULT E'a'", false, "E'...'"},
		{"ALTER TABLE kv ADD COLUMN x int DEFAULT $$ references $$", false, "dollar"},
		{"COMMENT ON TABLE kv IS 'x'; DROP TABLE kv", false, "DROP TABLE"},
		{"ALTER TABLE kv ADD COLUMN x text /* never closed", false, "never closed"},
	} {
		safe, why := StreamSafe(tc.sql)
		if safe != tc.safe || !strings.Contains(why, tc.why) {
			t.Errorf("StreamSafe(%q) = %v, %q; want %v, containing %q", tc.sql, safe, why, tc.safe, tc.why)
		}
		if !safe && !strings.Contains(why, "a reverse stream carries only") {
			t.Errorf("StreamSafe(%q): the reason %q does not say what may run", tc.sql, why)
		}
	}
}

// FuzzStreamSafe: the classifier never panics; a text it finds safe is cut
// into the same statements by Split, and stays safe with a comment added
// (comments never make a statement).
func FuzzStreamSafe(f *testing.F) {
	for _, s := range []string{"ALTER TABLE kv ADD COLUMN a int", "CREATE INDEX i ON t (a); ANALYZE t;; COMMENT ON TABLE t IS 'a;b'", "CREATE INDEX i ON kv ((v || ','))", "ALTER TABLE t ADD x text DEFAULT E'\\'', DROP y", "$$", "'", "/*"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		safe, _ := StreamSafe(s)
		if safe {
			// Split (what the apply runs) and the classifier see the
			// same statements.
			stmts, err := Split(s)
			toks, _ := tokenize(s)
			n := 0
			for i, t := range toks {
				if !t.is(';') && (i == 0 || toks[i-1].is(';')) {
					n++
				}
			}
			if err != nil || len(stmts) != n {
				t.Fatalf("%q is safe with %d statements, but Split finds %d (%v)", s, n, len(stmts), err)
			}
			if again, why := StreamSafe("-- note\n" + s); !again {
				t.Fatalf("%q is safe, but not with a leading comment: %s", s, why)
			}
		}
	})
}
