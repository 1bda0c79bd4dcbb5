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
// publisher took), leave rows behind on a rollback (a new table is in no
// move's publication), or fill a new column differently on each node (a
// volatile default, a serial or identity column: a rollback would bring
// back the old owner's values). Such a change closes the windows first,
// or waits for them (Options.CloseWindow).
//
// The check is a small grammar over PostgreSQL's own tokens, not a search
// for keywords: what it does not recognise is not safe. The change runs as
// one batch that PostgreSQL splits itself, so the text is tokenized whole,
// and a string whose meaning depends on a setting (a backslash in it,
// E'...') is not safe either.

// streamSafeWords names the statements that run beside reverse streams.
const streamSafeWords = "ALTER TABLE ... ADD [COLUMN] name type [COLLATE c] [DEFAULT constant] [[NOT] NULL], " +
	"CREATE INDEX [CONCURRENTLY] ... ON table [USING method] (columns) [INCLUDE (columns)] without UNIQUE or expressions, COMMENT ON ... IS, ANALYZE"

// StreamSafe reports whether every statement of a change's text can run
// while moves are in their rollback windows, and if not, why: the first
// statement that cannot, by its line.
func StreamSafe(text string) (bool, string) {
	toks, err := tokenize(text)
	if err != nil {
		return false, err.Error() + "; a reverse stream carries only " + streamSafeWords
	}
	for len(toks) > 0 {
		end := slices.IndexFunc(toks, func(t token) bool { return t.is(';') })
		if end < 0 {
			end = len(toks)
		}
		if stmt := toks[:end]; len(stmt) > 0 {
			if why := streamUnsafe(stmt); why != "" {
				return false, fmt.Sprintf("line %d: %s; a reverse stream carries only %s", stmt[0].line, why, streamSafeWords)
			}
		}
		toks = toks[min(end+1, len(toks)):]
	}
	return true, ""
}

// token is one of PostgreSQL's tokens: a word (upper-cased), a quoted
// name, a string constant, a number, or punctuation.
type token struct {
	kind byte // 'w' word, 'q' quoted name, 's' string, 'n' number, 'p' punctuation
	text string
	line int
}

func (t token) is(p byte) bool     { return t.kind == 'p' && t.text == string(p) }
func (t token) word(w string) bool { return t.kind == 'w' && t.text == w }
func (t token) name() bool         { return t.kind == 'w' || t.kind == 'q' }
func (t token) String() string     { return t.text }
func startsWith(ts []token, ws ...string) bool {
	if len(ts) < len(ws) {
		return false
	}
	for i, w := range ws {
		if !ts[i].word(w) {
			return false
		}
	}
	return true
}

// tokenize cuts text into tokens, without comments. A string constant
// with a backslash, an E” (or U&”, B”, X”) string, a dollar-quoted
// string and an unterminated quote or comment are errors: their meaning
// depends on settings, or they are never a plain constant.
func tokenize(text string) ([]token, error) {
	var out []token
	line := 1
	i := 0
	for i < len(text) {
		c := text[i]
		switch {
		case c == '\n':
			line++
			i++
		case c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == '-' && strings.HasPrefix(text[i:], "--"):
			for i < len(text) && text[i] != '\n' {
				i++
			}
		case c == '/' && strings.HasPrefix(text[i:], "/*"):
			n := blockEnd(text[i:])
			if n < 0 {
				return nil, fmt.Errorf("line %d: a /* comment is never closed", line)
			}
			line += strings.Count(text[i:i+n], "\n")
			i += n
		case c == '\'' || c == '"':
			j := i + 1
			for {
				k := strings.IndexByte(text[j:], c)
				if k < 0 {
					return nil, fmt.Errorf("line %d: a %c quote is never closed", line, c)
				}
				j += k + 1
				if j < len(text) && text[j] == c {
					j++
					continue
				}
				break
			}
			body := text[i:j]
			if c == '\'' && strings.ContainsRune(body, '\\') {
				return nil, fmt.Errorf("line %d: a string with a backslash (its meaning depends on standard_conforming_strings)", line)
			}
			kind := byte('s')
			if c == '"' {
				kind = 'q'
			}
			out = append(out, token{kind, body, line})
			line += strings.Count(body, "\n")
			i = j
		case c == '$' && dollarTag(text[i:]) != "":
			return nil, fmt.Errorf("line %d: a dollar-quoted string", line)
		case isIdentStart(c):
			j := i
			for j < len(text) && isIdent(text[j]) {
				j++
			}
			w := strings.ToUpper(text[i:j])
			if j < len(text) && (text[j] == '\'' || text[j] == '&') && (w == "E" || w == "U" || w == "B" || w == "X" || w == "N") {
				return nil, fmt.Errorf("line %d: a %s'...' string", line, w)
			}
			out = append(out, token{'w', w, line})
			i = j
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(text) && text[i+1] >= '0' && text[i+1] <= '9':
			j := i
			for j < len(text) && (isIdent(text[j]) || text[j] == '.') {
				j++
			}
			out = append(out, token{'n', text[i:j], line})
			i = j
		case c == ':' && strings.HasPrefix(text[i:], "::"):
			out = append(out, token{'p', "::", line})
			i += 2
		default:
			out = append(out, token{'p', string(c), line})
			i++
		}
	}
	return out, nil
}

// streamUnsafe says why a statement cannot run beside a reverse stream
// ("": it can).
func streamUnsafe(ts []token) string {
	switch {
	case startsWith(ts, "COMMENT", "ON"):
		// COMMENT ON object IS 'text' | NULL.
		n := len(ts)
		if n >= 4 && ts[n-2].word("IS") && (ts[n-1].kind == 's' || ts[n-1].word("NULL")) {
			return ""
		}
		return "a COMMENT not of the form COMMENT ON ... IS 'text'"
	case ts[0].word("ANALYZE"):
		for _, t := range ts[1:] {
			if !t.name() && !t.is('.') && !t.is(',') && !t.is('(') && !t.is(')') {
				return "an ANALYZE with " + t.text
			}
		}
		return ""
	case startsWith(ts, "CREATE", "INDEX"):
		return indexUnsafe(ts[2:])
	case startsWith(ts, "CREATE", "UNIQUE"):
		return "CREATE UNIQUE INDEX (the subscriber, changed first, would refuse rows the publisher took)"
	case startsWith(ts, "ALTER", "TABLE"):
		return alterUnsafe(ts[2:])
	}
	head := make([]string, 0, 3)
	for _, t := range ts[:min(len(ts), 3)] {
		head = append(head, t.text)
	}
	return strings.Join(head, " ") + " is not an addition"
}

// qualifiedName consumes name or schema.name, and reports how many
// tokens it took (0: none there).
func qualifiedName(ts []token) int {
	if len(ts) == 0 || !ts[0].name() {
		return 0
	}
	if len(ts) >= 3 && ts[1].is('.') && ts[2].name() {
		return 3
	}
	return 1
}

// table consumes [ONLY] name or schema.name, and reports whether it was
// there.
func table(ts []token) ([]token, bool) {
	if startsWith(ts, "ONLY") {
		ts = ts[1:]
	}
	n := qualifiedName(ts)
	return ts[n:], n > 0
}

// alterUnsafe checks ALTER TABLE's tail: [IF EXISTS] [ONLY] name, then
// actions each of which adds a column (addColumnUnsafe).
func alterUnsafe(ts []token) string {
	if startsWith(ts, "IF", "EXISTS") {
		ts = ts[2:]
	}
	ts, ok := table(ts)
	if !ok {
		return "an ALTER TABLE without a table"
	}
	if len(ts) > 0 && ts[0].is('*') {
		ts = ts[1:]
	}
	if len(ts) == 0 {
		return "an ALTER TABLE without an action"
	}
	for _, action := range splitTop(ts, ',') {
		if why := addColumnUnsafe(action); why != "" {
			return why
		}
	}
	return ""
}

// columnWords end a column's type: what may follow it.
var columnWords = []string{"COLLATE", "DEFAULT", "NOT", "NULL"}

// addColumnUnsafe checks one action: ADD [COLUMN] [IF NOT EXISTS] name
// type [COLLATE c] [DEFAULT constant] [[NOT] NULL], NOT NULL only with a
// DEFAULT.
func addColumnUnsafe(ts []token) string {
	if len(ts) == 0 || !ts[0].word("ADD") {
		verb := ""
		for _, t := range ts[:min(len(ts), 2)] {
			verb += " " + t.text
		}
		return "ALTER TABLE ..." + verb + " is not an addition"
	}
	ts = ts[1:]
	if startsWith(ts, "COLUMN") {
		ts = ts[1:]
	}
	if startsWith(ts, "IF", "NOT", "EXISTS") {
		ts = ts[3:]
	}
	if len(ts) == 0 || !ts[0].name() || slices.ContainsFunc([]string{"CONSTRAINT", "PRIMARY", "UNIQUE", "CHECK", "FOREIGN", "EXCLUDE"}, ts[0].word) {
		return "ALTER TABLE ... ADD of a constraint (the subscriber, changed first, would refuse rows the publisher took)"
	}
	ts = ts[1:]
	// The type: names, (numbers), [] up to what may follow it.
	typ := 0
	for typ < len(ts) && !(ts[typ].kind == 'w' && slices.Contains(columnWords, ts[typ].text)) {
		t := ts[typ]
		switch {
		case t.kind == 'w' && strings.Contains("|SERIAL|SMALLSERIAL|BIGSERIAL|SERIAL2|SERIAL4|SERIAL8|", "|"+t.text+"|"):
			return "ALTER TABLE ... ADD of a " + strings.ToLower(t.text) + " column (each node numbers its rows itself)"
		case t.kind == 'w' && (t.text == "GENERATED" || t.text == "IDENTITY"):
			return "ALTER TABLE ... ADD of a generated or identity column (each node fills its rows itself)"
		case t.kind == 'w' && slices.Contains([]string{"CONSTRAINT", "PRIMARY", "UNIQUE", "CHECK", "REFERENCES", "EXCLUDE"}, t.text):
			return "ALTER TABLE ... ADD with " + t.text + " (the subscriber, changed first, would refuse rows the publisher took)"
		case t.name(), t.kind == 'n', t.is('.'), t.is('('), t.is(')'), t.is(','), t.is('['), t.is(']'):
		default:
			return "ALTER TABLE ... ADD with " + t.text + " in the column's type"
		}
		typ++
	}
	if typ == 0 {
		return "ALTER TABLE ... ADD of a column without a type"
	}
	ts = ts[typ:]
	hasDefault, notNull := false, false
	for len(ts) > 0 {
		switch {
		case startsWith(ts, "COLLATE"):
			n := qualifiedName(ts[1:])
			if n == 0 {
				return "ALTER TABLE ... ADD ... COLLATE without a collation"
			}
			ts = ts[1+n:]
		case startsWith(ts, "NOT", "NULL"):
			notNull, ts = true, ts[2:]
		case startsWith(ts, "NULL"):
			ts = ts[1:]
		case startsWith(ts, "DEFAULT"):
			n := constant(ts[1:])
			if n == 0 {
				return "ALTER TABLE ... ADD ... DEFAULT that is not a constant (each node would compute its own values)"
			}
			hasDefault, ts = true, ts[1+n:]
		default:
			return "ALTER TABLE ... ADD with " + ts[0].text + " (the subscriber, changed first, would refuse rows the publisher took)"
		}
	}
	if notNull && !hasDefault {
		return "ALTER TABLE ... ADD ... NOT NULL without a DEFAULT (rows the stream brings without the column would be refused)"
	}
	return ""
}

// constant consumes a constant: [-]number, 'string', TRUE, FALSE or NULL,
// with an optional ::type (a name, and (numbers)); 0 if there is none.
func constant(ts []token) int {
	n := 0
	switch {
	case len(ts) >= 2 && ts[0].is('-') && ts[1].kind == 'n':
		n = 2
	case len(ts) >= 1 && (ts[0].kind == 'n' || ts[0].kind == 's' || ts[0].word("TRUE") || ts[0].word("FALSE") || ts[0].word("NULL")):
		n = 1
	default:
		return 0
	}
	if n < len(ts) && ts[n].is(':') {
		return 0
	}
	if n < len(ts) && ts[n].text == "::" {
		m := qualifiedName(ts[n+1:])
		if m == 0 {
			return 0
		}
		n += 1 + m
		if n < len(ts) && ts[n].is('(') {
			j := n + 1
			for j < len(ts) && (ts[j].kind == 'n' || ts[j].is(',')) {
				j++
			}
			if j == len(ts) || !ts[j].is(')') {
				return 0
			}
			n = j + 1
		}
	}
	return n
}

// indexUnsafe checks CREATE INDEX's tail: [CONCURRENTLY] [IF NOT EXISTS]
// [name] ON [ONLY] table [USING method] (columns) [INCLUDE (columns)],
// each column a plain name with an optional operator class, ASC/DESC and
// NULLS FIRST/LAST. An expression may fail on the subscriber for a row
// the publisher took; a predicate or storage options are not needed.
func indexUnsafe(ts []token) string {
	if startsWith(ts, "CONCURRENTLY") {
		ts = ts[1:]
	}
	if startsWith(ts, "IF", "NOT", "EXISTS") {
		ts = ts[3:]
	}
	if len(ts) > 0 && !ts[0].word("ON") && ts[0].name() {
		ts = ts[1:]
	}
	if !startsWith(ts, "ON") {
		return "a CREATE INDEX without ON table"
	}
	ts, ok := table(ts[1:])
	if !ok {
		return "a CREATE INDEX without a table"
	}
	if startsWith(ts, "USING") {
		if len(ts) < 2 || !ts[1].name() {
			return "a CREATE INDEX ... USING without a method"
		}
		ts = ts[2:]
	}
	rest, why := indexColumns(ts)
	if why != "" {
		return why
	}
	if startsWith(rest, "INCLUDE") {
		if rest, why = indexColumns(rest[1:]); why != "" {
			return why
		}
	}
	if len(rest) > 0 {
		return "a CREATE INDEX with " + rest[0].text + " (only columns, an operator class, ASC/DESC, NULLS FIRST/LAST and INCLUDE run beside reverse streams)"
	}
	return ""
}

// indexColumns consumes ( column [opclass] [ASC|DESC] [NULLS FIRST|LAST], ... ).
func indexColumns(ts []token) ([]token, string) {
	if len(ts) == 0 || !ts[0].is('(') {
		return nil, "a CREATE INDEX without (columns)"
	}
	end := slices.IndexFunc(ts, func(t token) bool { return t.is(')') })
	if end < 0 {
		return nil, "a CREATE INDEX whose (columns) never close"
	}
	for _, col := range splitTop(ts[1:end], ',') {
		if len(col) == 0 || !col[0].name() {
			return nil, "a CREATE INDEX on an expression (it may fail on the subscriber for a row the publisher took)"
		}
		for _, t := range col[1:] {
			if !t.name() && !t.is('.') {
				return nil, "a CREATE INDEX on an expression (it may fail on the subscriber for a row the publisher took)"
			}
		}
	}
	return ts[end+1:], ""
}

// splitTop cuts tokens at sep outside parentheses and brackets.
func splitTop(ts []token, sep byte) [][]token {
	var out [][]token
	depth, start := 0, 0
	for i, t := range ts {
		switch {
		case t.is('(') || t.is('['):
			depth++
		case t.is(')') || t.is(']'):
			depth--
		case t.is(sep) && depth == 0:
			out = append(out, ts[start:i])
			start = i + 1
		}
	}
	return append(out, ts[start:])
}
