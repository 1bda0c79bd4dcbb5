// Package archtest checks the architecture rules of docs/architecture.md
// against the code, so that they cannot drift silently:
//
//   - packages import only packages of a lower layer (no cycles by
//     accident, no library importing a command, no peer importing a peer);
//   - only topo and zksession call the ZooKeeper session's data methods, so
//     that every path and record format has one owner, and inside topo
//     only acl.go creates znodes or sets ACLs, so that every znode takes
//     the ACL of its kind;
//   - no exported signature of a public package names an internal type, so
//     that an application in its own module can call all of it;
//   - examples use the public API only.
//
// It type-checks the module's non-test files against the compiler's export
// data (`go list -export`), so it needs no server and no extra dependency.
package archtest

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/shardvisor/shardvisor"

// layer of each library package: a package may import only packages of a
// strictly lower layer. Commands, examples, benchmarks and e2e sit above
// all of them (layerTop) and may import any library package.
var layer = map[string]int{
	"keystream":          0,
	"workerproto":        0,
	"hint":               0,
	"internal/backoff":   0,
	"internal/benchkit":  0,
	"internal/failpoint": 0,
	"internal/sqlstate":  0,
	// The binary's build (module version, commit): --version, build_info.
	"internal/version":    0,
	"internal/faultproxy": 1,
	// Test hosts in network namespaces, their partitions and the wire check.
	"internal/hosts": 0,
	// Certificates and TLS configurations: below everything that dials.
	"internal/pki":     0,
	"internal/devenv":  1,
	"internal/testenv": 2,
	"internal/testkit": 0,
	// A Prometheus server in a test (it takes its port from testenv).
	"internal/promtest": 3,
	// The supervisor tests' worker process (a command, built by them).
	"internal/testworker":  layerTop,
	"internal/clustertest": 6,
	"internal/archtest":    0,
	"zksession":            1,
	"topo":                 2,
	"zksession/memzk":      2,
	"internal/zktest":      3,
	"bucketmap":            3,
	"dbnode":               4,
	"fence":                5,
	// A node's pooler (PgBouncer) state, read from its admin console.
	"pooler": 5,
	// What each bucket holds on its owner, for the planner by size.
	"sizing": 5,
	// What the members have applied, read from their records (topo), for
	// the components that ask it.
	"fleet": 5,
	// Every change of bucket ownership with its fence sync: above the map
	// (bucketmap), the fences (fence) and the records (topo), below the
	// mover and the rebalancer (migrate) and the commands.
	"ownership": 6,
	// Schema changes on every db node, recorded (topo), compared with
	// the fence's comparison (fence).
	"schema": 6,
	// The components are peers: none imports another.
	"router":     7,
	"supervisor": 7,
	"migrate":    7,
	"gc":         7,
	"worker":     7,
	// Backups, restore points and bucket restores: a component beside the
	// mover (it changes ownership through ownership, holds the fence's
	// drain locks, and never imports migrate).
	"backup": 7,
	// The router's HTTP API, above the router and the fleet.
	"sidecar": 8,
	// Flag and output plumbing shared by the commands only.
	"internal/cliutil": 9,
	// The benchmarks' write load on app.kv, through the router.
	"internal/benchkit/kvload": 8,
	// No code: the deployable files (Prometheus rules, the dashboard) and
	// the test that checks them.
	"deploy": 0,
}

const layerTop = 100

// testSupport are the packages for tests: a library package never imports
// one (they may import each other).
var testSupport = map[string]bool{
	"internal/testenv": true, "internal/devenv": true, "internal/faultproxy": true, "internal/zktest": true, "internal/hosts": true,
	"internal/clustertest": true, "zksession/memzk": true, "internal/testkit": true, "internal/promtest": true,
	"internal/testworker":      true,
	"internal/benchkit/kvload": true,
}

// The session's data methods: only the record owner (topo) and the session
// layer itself call them.
var sessionDataMethods = []string{"Get", "Set", "Create", "CreateAll", "CreateWithACL", "Delete", "DeleteAll", "Children",
	"Multi", "Exists", "Sync", "Watch", "WatchChildren", "CreateEphemeral", "TryLock", "Lock", "GetACL", "SetACL"}

// The session's methods and the operation that create znodes or set ACLs,
// and the one file of topo that may call them (it applies the ACL of each
// znode's kind).
var (
	sessionCreateMethods = []string{"Create", "CreateAll", "CreateWithACL", "CreateEphemeral", "TryLock", "Lock", "SetACL"}
	sessionCreateFuncs   = []string{"CreateOp"}
	topoACLFile          = "acl.go"
)

var sessionOwners = []string{"topo", "zksession", "internal/zktest"}

type pkg struct {
	ImportPath string
	Name       string
	Dir        string
	Export     string
	GoFiles    []string
	Imports    []string
	Standard   bool
	Module     *struct{ Path string }
}

func (p *pkg) rel() string { return strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/") }

func (p *pkg) layer() (int, bool) {
	r := p.rel()
	for _, top := range []string{"cmd/", "examples/", "bench/", "e2e", "clients/"} {
		if strings.HasPrefix(r, top) {
			return layerTop, true
		}
	}
	l, ok := layer[r]
	return l, ok
}

func (p *pkg) public() bool {
	r := p.rel()
	return p.Name != "main" && !strings.HasPrefix(r, "internal/") && !strings.HasPrefix(r, "cmd/") &&
		!strings.HasPrefix(r, "bench/") && !strings.HasPrefix(r, "examples/") && !strings.HasPrefix(r, "clients/") && r != "e2e"
}

// load lists the module's packages and the export data of everything they
// depend on, once per test binary.
func load(t *testing.T) (mine []*pkg, exports map[string]string) {
	t.Helper()
	loaded.once.Do(func() { loaded.mine, loaded.exports, loaded.err = goList() })
	if loaded.err != nil {
		t.Fatal(loaded.err)
	}
	return loaded.mine, loaded.exports
}

// loaded is load's result: `go list -deps -export` over the module takes
// seconds even with everything built, and every test asks for it.
var loaded struct {
	once    sync.Once
	mine    []*pkg
	exports map[string]string
	err     error
}

func goList() (mine []*pkg, exports map[string]string, err error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, nil, err
	}
	args := []string{"list", "-deps", "-export", "-json=ImportPath,Name,Dir,Export,GoFiles,Imports,Standard,Module"}
	if raceEnabled {
		// Under `go test -race` (make test) the packages are in the build
		// cache as race builds: asking for those reuses them rather than
		// compiling the whole module again for the export data.
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./...")...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("go list: %v", err)
	}
	exports = map[string]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, nil, fmt.Errorf("go list output: %v", err)
		}
		exports[p.ImportPath] = p.Export
		if p.Module != nil && p.Module.Path == module {
			mine = append(mine, &p)
		}
	}
	if len(mine) < 10 {
		return nil, nil, fmt.Errorf("go list found only %d packages of %s: run from inside the module", len(mine), module)
	}
	return mine, exports, nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// check type-checks a package's non-test files against export data, once
// per test binary: the tests only read what it returns.
func check(t *testing.T, p *pkg, exports map[string]string) (*token.FileSet, []*ast.File, *types.Package, *types.Info) {
	t.Helper()
	c, ok := checked[p.ImportPath]
	if !ok {
		c.fset, c.files, c.tp, c.info = typeCheck(t, p, exports)
		checked[p.ImportPath] = c
	}
	return c.fset, c.files, c.tp, c.info
}

// checked holds check's results by import path (the tests run one at a time).
var checked = map[string]struct {
	fset  *token.FileSet
	files []*ast.File
	tp    *types.Package
	info  *types.Info
}{}

func typeCheck(t *testing.T, p *pkg, exports map[string]string) (*token.FileSet, []*ast.File, *types.Package, *types.Info) {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	for _, f := range p.GoFiles {
		af, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, 0)
		if err != nil {
			t.Fatalf("%s: %v", p.ImportPath, err)
		}
		files = append(files, af)
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		e := exports[path]
		if e == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(e)
	})
	info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}, Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: imp}
	tp, err := conf.Check(p.ImportPath, fset, files, info)
	if err != nil {
		t.Fatalf("type-checking %s: %v", p.ImportPath, err)
	}
	return fset, files, tp, info
}

func TestImportLayers(t *testing.T) {
	mine, _ := load(t)
	var bad []string
	for _, p := range mine {
		from, ok := p.layer()
		if !ok {
			bad = append(bad, fmt.Sprintf("%s has no layer: add it to archtest's table and to docs/architecture.md", p.rel()))
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			q := &pkg{ImportPath: imp}
			to, ok := q.layer()
			if !ok {
				continue // reported as a package of its own
			}
			switch {
			case to == layerTop:
				bad = append(bad, fmt.Sprintf("%s imports %s: nothing imports a command, example, benchmark or e2e", p.rel(), q.rel()))
			case from != layerTop && to >= from:
				bad = append(bad, fmt.Sprintf("%s (layer %d) imports %s (layer %d): a package imports only lower layers", p.rel(), from, q.rel(), to))
			case strings.HasPrefix(p.rel(), "examples/") && strings.HasPrefix(q.rel(), "internal/"):
				bad = append(bad, fmt.Sprintf("%s imports %s: examples use the public API only", p.rel(), q.rel()))
			case from != layerTop && testSupport[q.rel()] && !testSupport[p.rel()]:
				bad = append(bad, fmt.Sprintf("%s imports %s, which is for tests", p.rel(), q.rel()))
			}
		}
	}
	report(t, bad)
}

func TestOnlyTopoAndSessionLayerCallSessionData(t *testing.T) {
	var bad []string
	eachSelector(t, func(p *pkg, file string) bool { return !slices.Contains(sessionOwners, p.rel()) },
		func(info *types.Info, sel *ast.SelectorExpr, pos string) {
			if sessionMethod(info, sel, sessionDataMethods) {
				bad = append(bad, fmt.Sprintf("%s: calls Session.%s; read and write records through package topo", pos, sel.Sel.Name))
			}
		})
	report(t, bad)
}

func TestOnlyTopoACLFileCreatesZnodes(t *testing.T) {
	session := module + "/zksession"
	var bad []string
	eachSelector(t, func(p *pkg, file string) bool { return p.rel() == "topo" && filepath.Base(file) != topoACLFile },
		func(info *types.Info, sel *ast.SelectorExpr, pos string) {
			if sessionMethod(info, sel, sessionCreateMethods) {
				bad = append(bad, fmt.Sprintf("%s: calls Session.%s; create znodes through topo/%s, which applies the ACL of their kind",
					pos, sel.Sel.Name, topoACLFile))
			} else if fn, ok := info.Uses[sel.Sel].(*types.Func); ok && fn.Pkg() != nil && fn.Pkg().Path() == session && slices.Contains(sessionCreateFuncs, fn.Name()) {
				bad = append(bad, fmt.Sprintf("%s: uses zksession.%s; create znodes through topo/%s, which applies the ACL of their kind",
					pos, fn.Name(), topoACLFile))
			}
		})
	report(t, bad)
}

// eachSelector type-checks the module's packages and calls fn for every
// selector expression (x.Name) in the files that want accepts, with its
// position relative to the module.
func eachSelector(t *testing.T, want func(p *pkg, file string) bool, fn func(info *types.Info, sel *ast.SelectorExpr, pos string)) {
	t.Helper()
	mine, exports := load(t)
	for _, p := range mine {
		if len(p.GoFiles) == 0 || !want(p, "") {
			continue
		}
		fset, files, _, info := check(t, p, exports)
		for _, f := range files {
			if !want(p, fset.Position(f.Pos()).Filename) {
				continue
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					fn(info, sel, rel(fset.Position(sel.Pos())))
				}
				return true
			})
		}
	}
}

// sessionMethod reports whether sel calls one of methods on a
// zksession.Session.
func sessionMethod(info *types.Info, sel *ast.SelectorExpr, methods []string) bool {
	s := info.Selections[sel]
	if s == nil || s.Kind() != types.MethodVal || !slices.Contains(methods, sel.Sel.Name) {
		return false
	}
	recv := s.Recv()
	if ptr, ok := recv.(*types.Pointer); ok {
		recv = ptr.Elem()
	}
	named, ok := recv.(*types.Named)
	return ok && named.Obj().Pkg() != nil && named.Obj().Pkg().Path() == module+"/zksession" && named.Obj().Name() == "Session"
}

func TestPublicSignaturesNameNoInternalType(t *testing.T) {
	mine, exports := load(t)
	var bad []string
	for _, p := range mine {
		if !p.public() || len(p.GoFiles) == 0 {
			continue
		}
		_, _, tp, _ := check(t, p, exports)
		scope := tp.Scope()
		for _, name := range scope.Names() {
			obj := scope.Lookup(name)
			if !obj.Exported() {
				continue
			}
			w := &walker{seen: map[types.Type]bool{}}
			w.walk(obj.Type(), true)
			if tn, ok := obj.(*types.TypeName); ok {
				if named, ok := tn.Type().(*types.Named); ok {
					w.walk(named.Underlying(), true)
					for i := 0; i < named.NumMethods(); i++ {
						if m := named.Method(i); m.Exported() {
							w.walk(m.Type(), true)
						}
					}
				}
			}
			for _, in := range w.internal {
				bad = append(bad, fmt.Sprintf("%s.%s names %s", p.rel(), name, in))
			}
		}
	}
	report(t, bad)
}

// walker collects internal named types reachable from an exported API.
type walker struct {
	seen     map[types.Type]bool
	internal []string
}

func (w *walker) walk(t types.Type, top bool) {
	if t == nil || w.seen[t] {
		return
	}
	w.seen[t] = true
	switch t := t.(type) {
	case *types.Named:
		if pk := t.Obj().Pkg(); pk != nil && strings.Contains(pk.Path(), "/internal/") {
			w.internal = append(w.internal, pk.Path()+"."+t.Obj().Name())
		}
		for i := 0; i < t.TypeArgs().Len(); i++ {
			w.walk(t.TypeArgs().At(i), false)
		}
		// A named type of another package is checked where it is defined.
		if top {
			w.walk(t.Underlying(), false)
		}
	case *types.Pointer:
		w.walk(t.Elem(), top)
	case *types.Slice:
		w.walk(t.Elem(), top)
	case *types.Array:
		w.walk(t.Elem(), top)
	case *types.Map:
		w.walk(t.Key(), top)
		w.walk(t.Elem(), top)
	case *types.Chan:
		w.walk(t.Elem(), top)
	case *types.Signature:
		for i := 0; i < t.Params().Len(); i++ {
			w.walk(t.Params().At(i).Type(), false)
		}
		for i := 0; i < t.Results().Len(); i++ {
			w.walk(t.Results().At(i).Type(), false)
		}
	case *types.Struct:
		for i := 0; i < t.NumFields(); i++ {
			if f := t.Field(i); f.Exported() {
				w.walk(f.Type(), false)
			}
		}
	case *types.Interface:
		for i := 0; i < t.NumMethods(); i++ {
			if m := t.Method(i); m.Exported() {
				w.walk(m.Type(), false)
			}
		}
	}
}

func rel(pos token.Position) string {
	if root, err := moduleRoot(); err == nil {
		if r, err := filepath.Rel(root, pos.Filename); err == nil {
			pos.Filename = r
		}
	}
	return pos.String()
}

func report(t *testing.T, bad []string) {
	t.Helper()
	sort.Strings(bad)
	bad = slices.Compact(bad)
	for _, b := range bad {
		t.Error(b)
	}
}
