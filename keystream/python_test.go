package keystream

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// pythonPackage is the directory of the Python package, whose module
// shardvisor.keystream is the reference, relative to this package.
const pythonPackage = "../clients/python"

// python returns the python3 interpreter (Debian's, when there is one),
// skipping the test if there is none, except under CI=true, where a
// missing interpreter would silently drop the cross-language check.
func python(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("python3 not found on PATH (required when CI=true): %v", err)
		}
		t.Skipf("python3 not found on PATH, skipping the cross-check with the Python reference: %v", err)
	}
	return p
}

// runPython runs the reference with args and returns its stdout.
func runPython(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(python(t), append([]string{"-m", "shardvisor.keystream"}, args...)...)
	// UTF-8 stdout whatever the locale, and no stray .pyc files.
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pythonPackage, "PYTHONUTF8=1", "PYTHONIOENCODING=utf-8", "PYTHONDONTWRITEBYTECODE=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("python3 -m shardvisor.keystream %s: %w\nstderr:\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// comparePython runs the Python reference's --vectors mode over f and
// compares every field it recomputes with the Go code.
func comparePython(t *testing.T, f vectorFile) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in.json")
	data, err := encodeVectors(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runPython(t, "--vectors", path)
	if err != nil {
		t.Fatal(err)
	}
	var py vectorFile
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&py); err != nil {
		t.Fatalf("decoding Python output: %v\n%s", err, out)
	}
	if py.Contract != Salt {
		t.Errorf("Python contract %q, want %q", py.Contract, Salt)
	}
	if len(py.Vectors) != len(f.Vectors) || len(py.Ranges) != len(f.Ranges) {
		t.Fatalf("Python returned %d vectors and %d ranges, want %d and %d",
			len(py.Vectors), len(py.Ranges), len(f.Vectors), len(f.Ranges))
	}
	for i, in := range f.Vectors {
		if goV := computeVector(t, in.Seed, in.UID, f.Levels); !equalJSON(py.Vectors[i], goV) {
			t.Errorf("vector %d (uid %q):\nPython %+v\n    Go %+v", i, in.UID, py.Vectors[i], goV)
		}
	}
	for i, in := range f.Ranges {
		if goR := computeRange(t, in.Level, in.Bucket); py.Ranges[i] != goR {
			t.Errorf("range %d: Python %+v, Go %+v", i, py.Ranges[i], goR)
		}
	}
}

// TestPythonVectors runs the Python reference over testdata/vectors.json.
func TestPythonVectors(t *testing.T) {
	python(t)
	comparePython(t, loadVectors(t))
}

// TestPythonRandom compares Go and Python on random seeds, uids (any
// Unicode scalar values) and bucket ranges.
func TestPythonRandom(t *testing.T) {
	python(t)
	rng := rand.New(rand.NewPCG(11, 12))
	f := vectorFile{Contract: Salt, Levels: []int{0, 1, 2, 3, 7, 13, 20, 31, 32}}
	for range 300 {
		seed := make([]byte, MinSeedLen+rng.IntN(80))
		for i := range seed {
			seed[i] = byte(rng.Uint32())
		}
		uid := randomUID(rng)
		if rng.IntN(2) == 0 {
			uid = randomScalarUID(rng)
		}
		f.Vectors = append(f.Vectors, vector{Seed: hex.EncodeToString(seed), UID: uid})
	}
	for range 300 {
		level := rng.IntN(MaxLevel + 1)
		f.Ranges = append(f.Ranges, rangeVector{Level: level, Bucket: uint32(rng.Uint64N(1 << level))})
	}
	comparePython(t, f)
}

// randomScalarUID returns up to 80 random Unicode scalar values (any plane,
// no surrogates), the inputs most likely to expose encoding slips in a port.
func randomScalarUID(rng *rand.Rand) string {
	var sb strings.Builder
	for n := rng.IntN(80); n > 0; n-- {
		var r rune
		switch rng.IntN(4) {
		case 0:
			r = rune(rng.IntN(0x80))
		case 1:
			r = rune(0x80 + rng.IntN(0x800-0x80))
		case 2:
			r = rune(0x800 + rng.IntN(0x10000-0x800))
		default:
			r = rune(0x10000 + rng.IntN(utf8.MaxRune+1-0x10000))
		}
		if !utf8.ValidRune(r) { // a surrogate half
			r = utf8.RuneError
		}
		sb.WriteRune(r)
	}
	return sb.String()
}

// TestPythonCLI checks the UID<TAB>BUCKET<TAB>PREFIX64 output format, which
// the Go CLI must match, and that bad arguments fail.
func TestPythonCLI(t *testing.T) {
	python(t)
	seed := Seed(testSeed)
	k := mustNew(t, seed)
	uids := []string{"alice", "user-42", "Ñandú", "\U0001F9D1\u200D\U0001F4BB", strings.Repeat("x", 200), ""}
	for _, level := range []int{0, 1, 16, 32} {
		out, err := runPython(t, append([]string{"--seed", seed.String(), "--level", fmt.Sprint(level)}, uids...)...)
		if err != nil {
			t.Fatal(err)
		}
		var want strings.Builder
		for _, uid := range uids {
			fmt.Fprintf(&want, "%s\t%d\t%016x\n", uid, k.Bucket(uid, level), k.Prefix64(uid))
		}
		if string(out) != want.String() {
			t.Errorf("level %d:\nPython:\n%s\nGo:\n%s", level, out, want.String())
		}
	}

	bad := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--seed", "0011", "--level", "8", "u"}, "seed is 2 bytes, want at least 16"},
		{[]string{"--seed", "zz" + seed.String()[2:], "--level", "8", "u"}, "not valid hex"},
		{[]string{"--seed", "abc", "--level", "8", "u"}, "odd number"},
		{[]string{"--seed", seed.String(), "--level", "33", "u"}, "level 33 out of range"},
		{[]string{"--seed", seed.String(), "--level", "-1", "u"}, "level -1 out of range"},
		{[]string{"--level", "8", "u"}, "--seed and --level are required"},
	}
	for _, c := range bad {
		_, err := runPython(t, c.args...)
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("python3 %q: err = %v, want a non-zero exit mentioning %q", c.args, err, c.wantErr)
		}
	}
}
