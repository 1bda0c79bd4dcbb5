package schema

import (
	"fmt"
	"regexp"
	"strings"
)

// Statement is one SQL statement of a change, as written, without its
// terminating semicolon, and the line it starts on.
type Statement struct {
	SQL  string
	Line int
}

// Split cuts a change's text into statements at the semicolons outside
// quotes ('...', E'...', "..."), dollar quotes ($tag$...$tag$) and
// comments (-- and nested /* */). Statements holding only comments and
// blanks are dropped. An unterminated quote or comment is an error naming
// its line: cutting such a text would run a different statement from the
// one written.
func Split(text string) ([]Statement, error) {
	var out []Statement
	start, line, startLine := 0, 1, 1
	paren, atomic := 0, 0 // parentheses and BEGIN ATOMIC bodies open
	emit := func(end int) {
		raw := text[start:end]
		s := strings.TrimSpace(raw)
		if s == "" || onlyComments(s) {
			return
		}
		// The line of the statement's first word, after any comment.
		lead := len(raw) - len(stripLeadingComments(raw))
		out = append(out, Statement{SQL: s, Line: startLine + strings.Count(raw[:lead], "\n")})
	}
	i := 0
	for i < len(text) {
		c := text[i]
		switch {
		case c == '\n':
			line++
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
			from := line
			// E'...' strings take backslash escapes; standard strings and
			// identifiers double the quote.
			escapes := c == '\'' && i > 0 && (text[i-1] == 'E' || text[i-1] == 'e') && (i < 2 || !isIdent(text[i-2]))
			i++
			closed := false
			for i < len(text) {
				ch := text[i]
				if ch == '\n' {
					line++
				}
				if escapes && ch == '\\' {
					i += 2
					continue
				}
				if ch == c {
					if i+1 < len(text) && text[i+1] == c {
						i += 2
						continue
					}
					i++
					closed = true
					break
				}
				i++
			}
			if !closed {
				return nil, fmt.Errorf("line %d: a %c quote is never closed", from, c)
			}
		case c == '$' && (i == 0 || !isIdent(text[i-1])):
			tag := dollarTag(text[i:])
			if tag == "" {
				i++
				continue
			}
			from := line
			end := strings.Index(text[i+len(tag):], tag)
			if end < 0 {
				return nil, fmt.Errorf("line %d: dollar quote %s is never closed", from, tag)
			}
			body := text[i : i+len(tag)+end+len(tag)]
			line += strings.Count(body, "\n")
			i += len(body)
		case c == '(':
			paren++
			i++
		case c == ')':
			paren = max(0, paren-1)
			i++
		case c == ';' && paren == 0 && atomic == 0:
			emit(i)
			i++
			start, startLine = i, line
		case isIdentStart(c) && (i == 0 || !isIdent(text[i-1])):
			// Words matter only for a SQL-standard body, BEGIN ATOMIC ...
			// END, whose semicolons do not end the statement (nor do
			// those of the CASE ... END inside it), as in psql.
			j := i
			for j < len(text) && isIdent(text[j]) {
				j++
			}
			switch w := strings.ToUpper(text[i:j]); {
			case w == "BEGIN" && strings.EqualFold(firstWord(text[j:]), "ATOMIC"):
				atomic++
			case atomic > 0 && w == "CASE":
				atomic++
			case atomic > 0 && w == "END":
				atomic--
			}
			i = j
		default:
			i++
		}
	}
	emit(len(text))
	return out, nil
}

var dollarRE = regexp.MustCompile(`^\$([A-Za-z_][A-Za-z0-9_]*)?\$`)

// dollarTag returns the opening dollar quote at the start of s ("$$",
// "$fn$"), or "" if s does not start with one ($1 is a parameter).
func dollarTag(s string) string { return dollarRE.FindString(s) }

func isIdentStart(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// firstWord returns the word s starts with after blanks and comments.
func firstWord(s string) string {
	s = stripLeadingComments(s)
	j := 0
	for j < len(s) && isIdent(s[j]) {
		j++
	}
	return s[:j]
}

func isIdent(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// onlyComments reports whether s holds nothing but comments (Split has
// already made sure they are closed).
func onlyComments(s string) bool {
	for s != "" {
		s = strings.TrimSpace(s)
		switch {
		case strings.HasPrefix(s, "--"):
			if j := strings.IndexByte(s, '\n'); j >= 0 {
				s = s[j+1:]
			} else {
				s = ""
			}
		case strings.HasPrefix(s, "/*"):
			j := blockEnd(s)
			if j < 0 {
				return false
			}
			s = s[j:]
		default:
			return s == ""
		}
	}
	return true
}

// words returns the first n words of a statement, upper-cased, skipping
// leading comments.
func words(stmt string, n int) []string {
	s := stripLeadingComments(stmt)
	f := strings.Fields(strings.ToUpper(s))
	if len(f) > n {
		f = f[:n]
	}
	return f
}

func stripLeadingComments(s string) string {
	for {
		s = strings.TrimSpace(s)
		switch {
		case strings.HasPrefix(s, "--"):
			j := strings.IndexByte(s, '\n')
			if j < 0 {
				return ""
			}
			s = s[j+1:]
		case strings.HasPrefix(s, "/*"):
			j := blockEnd(s)
			if j < 0 {
				return ""
			}
			s = s[j:]
		default:
			return s
		}
	}
}

// transactionControl names a statement that ends or opens a transaction:
// a change may not hold one, since shardctl decides where each node's
// transaction begins and ends (and records the change inside it).
func transactionControl(stmt string) string {
	w := words(stmt, 2)
	if len(w) == 0 {
		return ""
	}
	switch w[0] {
	case "BEGIN", "COMMIT", "ROLLBACK", "END", "ABORT", "SAVEPOINT", "RELEASE":
		return w[0]
	case "START":
		if len(w) > 1 && w[1] == "TRANSACTION" {
			return "START TRANSACTION"
		}
	case "PREPARE":
		if len(w) > 1 && w[1] == "TRANSACTION" {
			return "PREPARE TRANSACTION"
		}
	}
	return ""
}

var concurrentlyRE = regexp.MustCompile(`(?is)^\s*(CREATE\s+(UNIQUE\s+)?INDEX|DROP\s+INDEX|REINDEX\s+(\(.*?\)\s*)?(INDEX|TABLE|SCHEMA|DATABASE|SYSTEM))\s+CONCURRENTLY\b|^\s*ALTER\s+TABLE\s.*\sDETACH\s+PARTITION\s.*\sCONCURRENTLY\s*$`)

// outsideTransaction reports whether PostgreSQL refuses stmt inside a
// transaction block, and why.
func outsideTransaction(stmt string) (string, bool) {
	s := stripLeadingComments(stmt)
	if concurrentlyRE.MatchString(s) {
		return "CONCURRENTLY", true
	}
	w := words(s, 3)
	if len(w) == 0 {
		return "", false
	}
	switch w[0] {
	case "VACUUM":
		return "VACUUM", true
	case "CREATE", "DROP":
		if len(w) > 1 && (w[1] == "DATABASE" || w[1] == "TABLESPACE") {
			return w[0] + " " + w[1], true
		}
		if len(w) > 1 && w[1] == "SUBSCRIPTION" {
			return w[0] + " SUBSCRIPTION", true
		}
	case "ALTER":
		if len(w) > 1 && w[1] == "SYSTEM" {
			return "ALTER SYSTEM", true
		}
	case "CLUSTER":
		if len(w) == 1 {
			return "CLUSTER", true
		}
	}
	return "", false
}

var createIndexRE = regexp.MustCompile(`(?is)^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?(?:("(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)\s+)?ON\s+(?:ONLY\s+)?((?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)(?:\.(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*))?)`)

// concurrentIndex returns the index a CREATE INDEX CONCURRENTLY statement
// builds, as PostgreSQL stores its name (unquoted, or folded to lower
// case), and its table as written; "" if stmt is none, or names no index
// (Parse refuses that: PostgreSQL would pick a new name on each run).
func concurrentIndex(stmt string) (name, table string) {
	m := createIndexRE.FindStringSubmatch(stripLeadingComments(stmt))
	if m == nil || m[1] == "" {
		return "", ""
	}
	return identName(m[1]), m[2]
}

// unnamedConcurrentIndex reports a CREATE INDEX CONCURRENTLY without a
// name.
func unnamedConcurrentIndex(stmt string) bool {
	m := createIndexRE.FindStringSubmatch(stripLeadingComments(stmt))
	return m != nil && m[1] == ""
}

// identName is an identifier as PostgreSQL stores it.
func identName(s string) string {
	if strings.HasPrefix(s, `"`) {
		return strings.ReplaceAll(s[1:len(s)-1], `""`, `"`)
	}
	return strings.ToLower(s)
}

var idHeaderRE = regexp.MustCompile(`(?m)^\s*--\s*shardvisor:id\s+(\S+)\s*$`)

// HeaderID returns the id a change's text gives itself in a comment line
// "-- shardvisor:id ID", or "".
func HeaderID(text string) string {
	m := idHeaderRE.FindStringSubmatch(text)
	if m == nil {
		return ""
	}
	return m[1]
}

// blockEnd returns the index just after the block comment s starts with,
// nested ones included, or -1 if it is never closed.
func blockEnd(s string) int {
	depth := 0
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(s[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return -1
}
