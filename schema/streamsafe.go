package schema

import (
	"fmt"
	"slices"
	"strings"
)

// A move in its rollback window keeps a reverse stream: logical
// replication from the bucket's new owner (the publisher) to its old one
// (the subscriber). A change that only adds what the stream can carry
// runs beside it, the subscriber first: an apply worker fills a column the
// publisher does not send with its default, but stops (and the stream with
// it) on a column it does not have. Anything else might stop the stream
// for good (a dropped or retyped column is still in the WAL the stream
// has to send; a constraint the subscriber gets first refuses rows the
// publisher took), or leave rows behind on a rollback (a new table is in
// no move's publication). Such a change closes the windows first, or
// waits for them (Options.CloseWindow).

// streamSafeWords names the statements that run beside reverse streams.
const streamSafeWords = "ALTER TABLE ... ADD [COLUMN] without a constraint, CREATE INDEX without UNIQUE, COMMENT ON, ANALYZE, SET, RESET"

// StreamSafe reports whether every statement of a change's text can run
// while moves are in their rollback windows, and if not, why: the first
// statement that cannot, by its line.
func StreamSafe(text string) (bool, string) {
	stmts, err := Split(text)
	if err != nil {
		return false, err.Error()
	}
	for _, st := range stmts {
		if why := streamUnsafe(st.SQL); why != "" {
			return false, fmt.Sprintf("line %d: %s; a reverse stream carries only %s", st.Line, why, streamSafeWords)
		}
	}
	return true, ""
}

// streamUnsafe says why stmt cannot run beside a reverse stream ("": it
// can).
func streamUnsafe(stmt string) string {
	w := sqlWords(stripLeadingComments(stmt))
	if len(w) == 0 {
		return ""
	}
	head := strings.Join(w[:min(len(w), 3)], " ")
	switch {
	case w[0] == "COMMENT" || w[0] == "ANALYZE" || w[0] == "SET" || w[0] == "RESET":
		return ""
	case len(w) >= 2 && w[0] == "CREATE" && w[1] == "INDEX":
		return ""
	case len(w) >= 2 && w[0] == "CREATE" && w[1] == "UNIQUE":
		return "CREATE UNIQUE INDEX (the subscriber, changed first, would refuse rows the publisher took)"
	case len(w) >= 2 && w[0] == "ALTER" && w[1] == "TABLE":
		return alterUnsafe(stmt)
	}
	return head + " is not an addition"
}

// constraintWords start or hold a constraint: on the subscriber first, it
// would refuse rows the publisher took.
var constraintWords = []string{"CONSTRAINT", "PRIMARY", "UNIQUE", "CHECK", "FOREIGN", "REFERENCES", "EXCLUDE"}

// alterUnsafe checks an ALTER TABLE: each of its actions must add a
// column without a constraint.
func alterUnsafe(stmt string) string {
	actions := topLevelCommas(stripLeadingComments(stmt))
	for i, a := range actions {
		w := sqlWords(a)
		if i == 0 {
			// ALTER TABLE [IF EXISTS] [ONLY] name action...
			j := 2
			if j+1 < len(w) && w[j] == "IF" && w[j+1] == "EXISTS" {
				j += 2
			}
			if j < len(w) && w[j] == "ONLY" {
				j++
			}
			j++ // the table's name
			if j >= len(w) {
				return "an ALTER TABLE without an action"
			}
			w = w[j:]
		}
		if len(w) == 0 || w[0] != "ADD" {
			verb := strings.Join(w[:min(len(w), 2)], " ")
			return fmt.Sprintf("ALTER TABLE ... %s is not an addition", verb)
		}
		for _, c := range w[1:] {
			if slices.Contains(constraintWords, c) {
				return fmt.Sprintf("ALTER TABLE ... ADD with %s (the subscriber, changed first, would refuse rows the publisher took)", c)
			}
		}
	}
	return ""
}

// sqlWords returns the words of s outside string constants, dollar
// quotes and comments, upper-cased. A name in double quotes or qualified
// (schema.table) is one word, "<name>": it is never a keyword.
func sqlWords(s string) []string {
	var out []string
	i := 0
	for i < len(s) {
		c := s[i]
		if j, ok := skipText(s, i); ok {
			i = j
			continue
		}
		switch {
		case isIdentStart(c) || c == '"':
			// A name: parts joined by dots, each plain or quoted.
			start, plain := i, true
			for {
				if i < len(s) && s[i] == '"' {
					i, plain = quoteEnd(s, i), false
				} else {
					for i < len(s) && isIdent(s[i]) {
						i++
					}
				}
				if i+1 < len(s) && s[i] == '.' && (isIdentStart(s[i+1]) || s[i+1] == '"') {
					i, plain = i+1, false
					continue
				}
				break
			}
			if plain {
				out = append(out, strings.ToUpper(s[start:i]))
			} else {
				out = append(out, "<name>")
			}
		default:
			i++
		}
	}
	return out
}

// skipText skips the comment, string constant or dollar-quoted text that
// starts at s[i], if one does: the index after it (the end of s for one
// never closed).
func skipText(s string, i int) (int, bool) {
	switch c := s[i]; {
	case c == '-' && strings.HasPrefix(s[i:], "--"):
		if j := strings.IndexByte(s[i:], '\n'); j >= 0 {
			return i + j, true
		}
		return len(s), true
	case c == '/' && strings.HasPrefix(s[i:], "/*"):
		if n := blockEnd(s[i:]); n > 0 {
			return i + n, true
		}
		return len(s), true
	case c == '\'':
		return quoteEnd(s, i), true
	case c == '$' && dollarTag(s[i:]) != "":
		tag := dollarTag(s[i:])
		if j := strings.Index(s[i+len(tag):], tag); j >= 0 {
			return i + len(tag) + j + len(tag), true
		}
		return len(s), true
	}
	return i, false
}

// quoteEnd returns the index just past the quoted text starting at s[i]
// (a doubled quote stays inside; E'...' strings take backslash escapes).
func quoteEnd(s string, i int) int {
	q := s[i]
	escapes := q == '\'' && i > 0 && (s[i-1] == 'E' || s[i-1] == 'e')
	i++
	for i < len(s) {
		switch {
		case escapes && s[i] == '\\':
			i += 2
		case s[i] == q && i+1 < len(s) && s[i+1] == q:
			i += 2
		case s[i] == q:
			return i + 1
		default:
			i++
		}
	}
	return i
}

// topLevelCommas cuts s at the commas outside parentheses, quotes,
// dollar quotes and comments.
func topLevelCommas(s string) []string {
	var out []string
	depth, start, i := 0, 0, 0
	for i < len(s) {
		c := s[i]
		if j, ok := skipText(s, i); ok {
			i = j
			continue
		}
		switch {
		case c == '"':
			i = quoteEnd(s, i)
			continue
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == ',' && depth == 0:
			out = append(out, s[start:i])
			start = i + 1
		}
		i++
	}
	return append(out, s[start:])
}
