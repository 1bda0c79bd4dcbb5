package deploy

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// make dist's tarball: the three binaries, each saying the version and
// commit it was given; deploy/ without package deploy's Go files; the
// Python sdist; SHA256SUMS that match; and the same bytes when built twice
// from one commit. A minute of builds (static, -trimpath): make
// test-faults runs it.
func TestLongDist(t *testing.T) {
	if os.Getenv("SHARDVISOR_FAULTS") != "1" || testing.Short() {
		t.Skip("builds the release twice: make test-faults runs it (SHARDVISOR_FAULTS=1)")
	}
	build := func(out string) string {
		cmd := exec.Command("../scripts/dist", out)
		cmd.Env = append(os.Environ(), "VERSION=v9.9.9-test")
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("scripts/dist: %v\n%s", err, stderrOf(err))
		}
		return strings.TrimSpace(string(b))
	}
	dir := t.TempDir()
	first := build(filepath.Join(dir, "a"))
	if !strings.Contains(filepath.Base(first), "shardvisor-v9.9.9-test-linux-") {
		t.Fatalf("tarball %s is not named after VERSION", first)
	}
	files := untar(t, first, filepath.Join(dir, "x"))
	root := filepath.Join(dir, "x", strings.TrimSuffix(filepath.Base(first), ".tar.gz"))
	for _, want := range []string{"bin/shardctl", "bin/supervisor", "bin/router", "deploy/systemd", "deploy/prometheus/shardvisor.rules.yml",
		"deploy/prometheus/tests", "deploy/grafana/shardvisor.json", "docs/operations.md", "README.md", "CHANGELOG.md", "SHA256SUMS"} {
		if _, err := os.Stat(filepath.Join(root, want)); err != nil {
			t.Errorf("the tarball lacks %s", want)
		}
	}
	sdist := ""
	for _, f := range files {
		if strings.HasPrefix(f, "deploy/") && strings.HasSuffix(f, ".go") {
			t.Errorf("the tarball ships %s (a test of the deploy files)", f)
		}
		if strings.HasPrefix(f, "python/shardvisor-") && strings.HasSuffix(f, ".tar.gz") {
			sdist = filepath.Join(root, f)
		}
	}
	if sdist == "" {
		t.Fatalf("the tarball has no Python sdist: %v", files)
	}
	// The sdist installs offline, as the README says, and imports.
	site := filepath.Join(dir, "site")
	if out, err := exec.Command("/usr/bin/python3", "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
		"--target", site, sdist).CombinedOutput(); err != nil {
		t.Fatalf("pip install %s: %v\n%s", sdist, err, out)
	}
	imp := exec.Command("/usr/bin/python3", "-c", "import shardvisor, sys; sys.stdout.write(shardvisor.__file__)")
	imp.Env = append(os.Environ(), "PYTHONPATH="+site)
	if out, err := imp.Output(); err != nil || !strings.HasPrefix(string(out), site) {
		t.Errorf("the installed package does not import from %s: %q, %v", site, out, err)
	}
	for _, b := range []string{"shardctl", "supervisor", "router"} {
		out, err := exec.Command(filepath.Join(root, "bin", b), "--version").Output()
		if err != nil || !strings.HasPrefix(string(out), b+" v9.9.9-test (commit ") || strings.Contains(string(out), "commit unknown") {
			t.Errorf("%s --version: %q, %v", b, out, err)
		}
	}
	sums, err := os.ReadFile(filepath.Join(root, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		sum, name, _ := strings.Cut(line, "  ")
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatalf("SHA256SUMS names %s: %v", name, err)
		}
		if h := sha256.Sum256(b); hex.EncodeToString(h[:]) != sum {
			t.Errorf("SHA256SUMS: %s does not match", name)
		}
	}
	// Reproducible: a second build of the same commit, byte for byte.
	second := build(filepath.Join(dir, "b"))
	a, _ := os.ReadFile(first)
	b, _ := os.ReadFile(second)
	if sha256.Sum256(a) != sha256.Sum256(b) {
		t.Errorf("two builds of one commit differ: %s and %s", first, second)
	}
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

// untar extracts path into dir and returns the names below its top
// directory.
func untar(t *testing.T, path, dir string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s is owned by %d:%d, not root", h.Name, h.Uid, h.Gid)
		}
		if _, rest, ok := strings.Cut(h.Name, "/"); ok && rest != "" {
			names = append(names, rest)
		}
		target := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(out, tr); err != nil {
				t.Fatal(err)
			}
			out.Close()
		}
	}
}
