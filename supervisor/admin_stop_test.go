package supervisor

import (
	"bufio"
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/testenv"
)

// A connection the admin server accepted before it stopped is answered,
// even when its request arrives after the stop began: an upgrade's
// hand-over stops the old supervisor's admin server while a load
// balancer's health check may be in that instant. (http.Server.Shutdown
// read such a request and closed the connection unanswered: EOF.)
func TestStopAdminAnswersAConnectionItAccepted(t *testing.T) {
	sv := adminOnly(t)
	c, err := net.Dial("tcp", sv.AdminAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testenv.WaitFor(t, 5*time.Second, func() bool { return sv.adminLn.open.Load() == 1 }, "the server to accept the connection")
	stopped := make(chan struct{})
	go func() { sv.stopAdmin(); close(stopped) }()
	// The stop has begun: the listener is closed (a new connection is
	// refused) while the accepted one waits for its request.
	testenv.WaitFor(t, 5*time.Second, func() bool {
		nc, err := net.DialTimeout("tcp", sv.AdminAddr(), 100*time.Millisecond)
		if err == nil {
			nc.Close()
		}
		return err != nil
	}, "the admin listener to close")
	select {
	case <-stopped:
		t.Fatal("stopAdmin returned with an accepted connection unanswered")
	default:
	}
	if _, err := c.Write([]byte("GET /livez HTTP/1.1\r\nHost: admin\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the accepted connection was not answered: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode == 0 || resp.Close != true {
		t.Fatalf("answer %d, close %v: want an answer that closes the connection", resp.StatusCode, resp.Close)
	}
	testenv.Receive(t, stopped, 5*time.Second, "stopAdmin to return once the connection is answered")
}

// Every admin endpoint only reads: GET and HEAD are answered, every other
// method is refused with 405 and Allow: GET, HEAD (they all answered 200).
func TestAdminEndpointsRefuseOtherMethods(t *testing.T) {
	sv := adminOnly(t)
	defer sv.stopAdmin()
	c := &http.Client{}
	for _, path := range []string{"/healthz", "/readyz", "/livez", "/metrics", "/status", peerPath} {
		for _, method := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "BREW"} {
			req, _ := http.NewRequest(method, "http://"+sv.AdminAddr()+path, strings.NewReader("{}"))
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			resp.Body.Close()
			allowed := method == "GET" || method == "HEAD"
			if got := resp.StatusCode == http.StatusMethodNotAllowed; got == allowed || (!allowed && resp.Header.Get("Allow") != "GET, HEAD") {
				t.Errorf("%s %s: HTTP %d, Allow %q", method, path, resp.StatusCode, resp.Header.Get("Allow"))
			}
		}
	}
}

// adminOnly is a supervisor of a one-worker pool from a config file with
// only its admin server started (no workers).
func adminOnly(t *testing.T) *Supervisor { return adminOnlyTLS(t, nil) }

// adminOnlyTLS is adminOnly with Options.AdminTLS.
func adminOnlyTLS(t *testing.T, cfg *tls.Config) *Supervisor {
	t.Helper()
	file := filepath.Join(t.TempDir(), "pool.json")
	if err := os.WriteFile(file, encode(t, cfgFor(t, testenv.FreePort(t), 1, nil)), 0o644); err != nil {
		t.Fatal(err)
	}
	sv, err := New(Options{Pool: "web", ConfigFile: file, AdminAddr: "127.0.0.1:0", StateDir: t.TempDir(), AdminTLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if err := sv.startAdmin(); err != nil {
		t.Fatal(err)
	}
	return sv
}
