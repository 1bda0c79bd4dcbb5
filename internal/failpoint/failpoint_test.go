package failpoint

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A failpoints build kills itself at the chosen failpoint and only there;
// a default build never does.
func TestInject(t *testing.T) {
	if os.Getenv("FAILPOINT_TEST_CHILD") == "1" {
		Inject("a")
		Inject("b")
		os.Stdout.WriteString("survived\n")
		os.Exit(0)
	}
	for _, tc := range []struct {
		target string
		killed bool
	}{{"", false}, {"x", false}, {"b", Enabled}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestInject$")
		cmd.Env = append(os.Environ(), "FAILPOINT_TEST_CHILD=1", Env+"="+tc.target)
		out, err := cmd.CombinedOutput()
		ee, _ := err.(*exec.ExitError)
		killed := ee != nil && ee.ExitCode() == -1
		if killed != tc.killed {
			t.Fatalf("failpoint %q (enabled %v): killed %v, want %v: %v\n%s", tc.target, Enabled, killed, tc.killed, err, out)
		}
		if killed && !strings.Contains(string(out), "failpoint b: killing") {
			t.Fatalf("killed without saying so: %s", out)
		}
		if !killed && !strings.Contains(string(out), "survived") {
			t.Fatalf("child did not run to the end: %v\n%s", err, out)
		}
	}
}
