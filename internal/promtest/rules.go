package promtest

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// Rewrite is one duration of a rule file that Shorten changed in the copy
// a test server loads: a rule's `for:` (Rule is the alert's name) or a
// group's `interval:` (Rule is "group NAME").
type Rewrite struct {
	File string // the file's base name
	Line int    // 1-based
	Rule string
	Key  string // "for" or "interval"
	From time.Duration
	To   time.Duration
}

func (r Rewrite) String() string {
	return fmt.Sprintf("%s: %s %s: %s -> %s", r.File, r.Rule, r.Key, model.Duration(r.From), model.Duration(r.To))
}

var (
	// itemLine starts an item of a YAML block list: "  - key: value".
	itemLine = regexp.MustCompile(`^(\s*)-\s+([A-Za-z_]+):\s*(.*)$`)
	// keyLine is "  key: value" (a comment after the value is kept).
	keyLine = regexp.MustCompile(`^(\s*)([A-Za-z_]+):\s*(.*)$`)
	// durationValue is a duration, maybe quoted, maybe followed by a
	// comment.
	durationValue = regexp.MustCompile(`^(["']?)([0-9][0-9a-z]*)(["']?)(\s*(#.*)?)$`)
)

// Shorten returns rule file src (Prometheus's YAML: groups of rules, in
// block style as promtool and every hand-written file use) with every
// alert's `for:` and every group's `interval:` longer than limit set to
// limit, and what it changed. Everything else is kept byte for byte. It
// knows YAML only as far as rule files need: a rule is a list item under
// `rules:`, its keys at the item's indentation. limit 0 changes nothing.
func Shorten(file string, src []byte, limit time.Duration) ([]byte, []Rewrite, error) {
	if limit <= 0 {
		return src, nil, nil
	}
	lines := strings.SplitAfter(string(src), "\n")
	var (
		out   []Rewrite
		stack []*ruleItem // the open list items, innermost last
	)
	// closeTo ends every open item whose keys sit deeper than indent.
	closeTo := func(indent int) {
		for len(stack) > 0 && stack[len(stack)-1].indent > indent {
			out = append(out, stack[len(stack)-1].named()...)
			stack = stack[:len(stack)-1]
		}
	}
	for i, line := range lines {
		body := strings.TrimRight(line, "\r\n")
		if t := strings.TrimSpace(body); t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		var indent int
		var key, value string
		if m := itemLine.FindStringSubmatch(body); m != nil {
			closeTo(len(m[1]))
			indent, key, value = len(m[1])+2, m[2], m[3]
			stack = append(stack, &ruleItem{indent: indent})
		} else if m := keyLine.FindStringSubmatch(body); m != nil {
			indent, key, value = len(m[1]), m[2], m[3]
			closeTo(indent)
		} else {
			continue
		}
		if len(stack) == 0 || stack[len(stack)-1].indent != indent {
			continue
		}
		cur := stack[len(stack)-1]
		switch key {
		case "alert", "record":
			cur.kind, cur.name = "rule", unquote(value)
		case "name":
			if cur.kind == "" {
				cur.kind, cur.name = "group", unquote(value)
			}
		case "for", "interval":
			d := durationValue.FindStringSubmatch(value)
			if d == nil {
				return nil, nil, fmt.Errorf("%s:%d: %s: %q is not a duration", file, i+1, key, value)
			}
			dur, err := model.ParseDuration(d[2])
			if err != nil {
				return nil, nil, fmt.Errorf("%s:%d: %s: %w", file, i+1, key, err)
			}
			if time.Duration(dur) <= limit {
				continue
			}
			lines[i] = body[:len(body)-len(value)] + d[1] + model.Duration(limit).String() + d[3] + d[4] + line[len(body):]
			cur.rewrites = append(cur.rewrites, Rewrite{File: file, Line: i + 1, Key: key, From: time.Duration(dur), To: limit})
		}
	}
	closeTo(-1)
	sort.Slice(out, func(a, b int) bool { return out[a].Line < out[b].Line })
	return []byte(strings.Join(lines, "")), out, nil
}

// ruleItem is a list item of a rule file being read: a group or a rule.
type ruleItem struct {
	indent   int    // of the item's keys
	kind     string // "group", "rule", or "" (unknown yet)
	name     string
	rewrites []Rewrite
}

// named returns the item's rewrites with its name, known once it ends.
func (it *ruleItem) named() []Rewrite {
	for i := range it.rewrites {
		it.rewrites[i].Rule = it.name
		if it.kind == "group" {
			it.rewrites[i].Rule = "group " + it.name
		}
	}
	return it.rewrites
}

// unquote strips a YAML scalar's quotes and a trailing comment.
func unquote(v string) string {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') {
		if j := strings.IndexByte(v[1:], v[0]); j >= 0 {
			return v[1 : j+1]
		}
	}
	if j := strings.Index(v, " #"); j >= 0 {
		v = v[:j]
	}
	return strings.TrimSpace(v)
}
