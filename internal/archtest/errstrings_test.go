package archtest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// maxErrorString bounds the text of an error string literal in a library
// package. An error says what is wrong; what the operator should run goes
// in a hint (package hint), which the commands print on a line of its own.
const maxErrorString = 200

// TestLibraryErrorStringsAreShort fails on any fmt.Errorf or errors.New in
// a library package whose message, counting the literal parts of a
// concatenation, is longer than maxErrorString.
func TestLibraryErrorStringsAreShort(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	var pkgs []string
	for p := range layer {
		if !testSupport[p] {
			pkgs = append(pkgs, p)
		}
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		dir := filepath.Join(root, filepath.FromSlash(p))
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			name := e.Name()
			if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, lit := range errorStrings(f) {
				if n := len(lit.text); n > maxErrorString {
					pos := fset.Position(lit.pos)
					bad = append(bad, fmt.Sprintf("%s:%d: error string of %d characters (max %d): put what to run in a hint: %.60q...",
						filepath.ToSlash(filepath.Join(p, name)), pos.Line, n, maxErrorString, lit.text))
				}
			}
		}
	}
	report(t, bad)
}

type errorString struct {
	pos  token.Pos
	text string
}

// errorStrings returns the first argument of every fmt.Errorf and
// errors.New call in f: its string literals, concatenated.
func errorStrings(f *ast.File) []errorString {
	names := map[string]string{} // local name -> import path
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		local := filepath.Base(path)
		if imp.Name != nil {
			local = imp.Name.Name
		}
		names[local] = path
	}
	var out []errorString
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		x, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}
		switch path, fn := names[x.Name], sel.Sel.Name; {
		case path == "fmt" && fn == "Errorf", path == "errors" && fn == "New":
			out = append(out, errorString{call.Pos(), literalText(call.Args[0])})
		}
		return true
	})
	return out
}

// literalText is the text of the string literals in e, a literal or a
// concatenation (other operands count as nothing).
func literalText(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(e.Value); err == nil && e.Kind == token.STRING {
			return s
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			return literalText(e.X) + literalText(e.Y)
		}
	case *ast.ParenExpr:
		return literalText(e.X)
	}
	return ""
}
