package supervisor

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// fakeEnv is an environment of its own and an executable path, in place
// of the process's.
type fakeEnv struct {
	mu   sync.Mutex
	vars map[string]string
	exe  string
}

func newFakeEnv(exe string, kv ...string) *fakeEnv {
	f := &fakeEnv{vars: map[string]string{}, exe: exe}
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		f.vars[k] = v
	}
	return f
}

func (f *fakeEnv) env() *env {
	return &env{
		getenv: func(k string) string {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.vars[k]
		},
		setenv: func(k, v string) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.vars[k] = v
			return nil
		},
		unsetenv: func(k string) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			delete(f.vars, k)
			return nil
		},
		environ: func() []string {
			f.mu.Lock()
			defer f.mu.Unlock()
			var kv []string
			for k, v := range f.vars {
				kv = append(kv, k+"="+v)
			}
			slices.Sort(kv)
			return kv
		},
		executable: func() (string, error) { return f.exe, nil },
	}
}

// New takes its executable, its state directory and the workers'
// environment from the env it is given, not from the process.
func TestEnvSeam(t *testing.T) {
	runtimeDir := t.TempDir()
	fe := newFakeEnv("/opt/fake/shardvisor", "RUNTIME_DIRECTORY="+runtimeDir, "FROM_FAKE_ENV=yes")
	dir := t.TempDir()
	file := filepath.Join(dir, "pool.json")
	if err := os.WriteFile(file, []byte(`{"version":1,"command":"app","workers":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	sv, err := newSupervisor(fe.env(), Options{Pool: "seam", ConfigFile: file})
	if err != nil {
		t.Fatal(err)
	}
	if sv.opts.ShimPath != fe.exe || sv.opts.UpgradeExec != fe.exe {
		t.Errorf("shim %q, upgrade exec %q: want the env's executable %q", sv.opts.ShimPath, sv.opts.UpgradeExec, fe.exe)
	}
	if want := filepath.Join(runtimeDir, "seam"); sv.opts.StateDir != want {
		t.Errorf("state dir %q, want %q (the env's RUNTIME_DIRECTORY)", sv.opts.StateDir, want)
	}

	t.Setenv("FROM_PROCESS_ENV", "yes")
	_, fos, stop := runFakeEnv(t, fe.env(), `{"version":1,"command":"app","workers":1}`)
	defer stop()
	got := envOf(fos.next(t))
	if got["FROM_FAKE_ENV"] != "yes" {
		t.Errorf("the worker's environment lacks the env's variables: %v", got)
	}
	if _, ok := got["FROM_PROCESS_ENV"]; ok {
		t.Errorf("the worker's environment came from the process, not the env: %v", got)
	}
}

// The handover is read from the env and removed from it, so that no
// worker inherits it.
func TestReadHandoverFromEnv(t *testing.T) {
	fe := newFakeEnv("", EnvInheritFDs+"=x=3")
	if _, _, err := readHandover(fe.env()); err == nil || !strings.Contains(err.Error(), EnvUpgrade) {
		t.Fatalf("inherited fds without a handover: %v", err)
	}
	if _, ok := fe.vars[EnvInheritFDs]; ok {
		t.Fatalf("%s left in the environment: %v", EnvInheritFDs, fe.vars)
	}
	if hv, inh, err := readHandover(newFakeEnv("").env()); err != nil || inh != nil || hv != (handover{}) {
		t.Fatalf("no handover: %+v %v %v", hv, inh, err)
	}
}
