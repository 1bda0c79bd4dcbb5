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
		{"ALTER TABLE kv ADD COLUMN d numeric(10,2) DEFAULT round(1.5, 1)", true, ""},
		{"-- a note\nCREATE INDEX CONCURRENTLY kv_note ON kv (note)", true, ""},
		{"CREATE INDEX kv_v ON kv (v); COMMENT ON COLUMN kv.v IS 'drop column v'; ANALYZE kv; SET lock_timeout = '1s'", true, ""},
		{`ALTER TABLE "drop" ADD COLUMN "check" int`, true, ""},
		{"ALTER TABLE kv ADD COLUMN x int DEFAULT $$ references $$", true, ""},

		{"ALTER TABLE kv DROP COLUMN v", false, "line 1: ALTER TABLE ... DROP COLUMN is not an addition"},
		{"ALTER TABLE kv ADD COLUMN a int, DROP COLUMN v", false, "DROP COLUMN"},
		{"ALTER TABLE kv ALTER COLUMN v TYPE bigint", false, "ALTER COLUMN"},
		{"ALTER TABLE kv RENAME COLUMN v TO w", false, "RENAME COLUMN"},
		{"ALTER TABLE kv ADD CONSTRAINT v_pos CHECK (v > 0)", false, "CONSTRAINT"},
		{"ALTER TABLE kv ADD COLUMN o int REFERENCES other (id)", false, "REFERENCES"},
		{"ALTER TABLE kv ADD COLUMN u int UNIQUE", false, "UNIQUE"},
		{"ALTER TABLE kv ADD PRIMARY KEY (k)", false, "PRIMARY"},
		{"CREATE UNIQUE INDEX kv_u ON kv (v)", false, "CREATE UNIQUE INDEX"},
		{"CREATE TABLE t2 (k bigint)", false, "CREATE TABLE"},
		{"CREATE INDEX i ON kv (v);\n\nDROP TABLE kv", false, "line 3: DROP TABLE"},
		{"UPDATE kv SET v = 0", false, "UPDATE"},
		{"ALTER TABLE kv", false, "without an action"},
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

// FuzzStreamSafe: the classifier never panics, and a safe text stays safe
// with a comment added (comments never make a statement).
func FuzzStreamSafe(f *testing.F) {
	for _, s := range []string{"ALTER TABLE kv ADD COLUMN a int", "CREATE INDEX i ON kv ((v || ','))", "ALTER TABLE t ADD x text DEFAULT E'\\'', DROP y", "$$", "'", "/*"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		safe, _ := StreamSafe(s)
		if safe {
			if again, why := StreamSafe("-- note\n" + s); !again {
				t.Fatalf("%q is safe, but not with a leading comment: %s", s, why)
			}
		}
	})
}
