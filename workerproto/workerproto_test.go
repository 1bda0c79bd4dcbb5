package workerproto_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
)

func TestParseMessage(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want workerproto.Message
	}{
		{"", workerproto.Message{}},
		{"READY=1", workerproto.Message{Ready: true}},
		{"READY=0", workerproto.Message{}},
		{"WATCHDOG=1", workerproto.Message{Watchdog: true}},
		{"STOPPING=1", workerproto.Message{Stopping: true}},
		{"RELOADING=1", workerproto.Message{Reloading: true}},
		{"STATUS=loading the app", workerproto.Message{Status: "loading the app"}},
		{"STATUS=a=b", workerproto.Message{Status: "a=b"}},
		{"READY=1\nSTATUS=up\nMAINPID=42", workerproto.Message{Ready: true, Status: "up"}},
		{"READY=1\n", workerproto.Message{Ready: true}},
		{"FDSTORE=1\nBOGUS\n=1", workerproto.Message{}},
		{"ready=1", workerproto.Message{}}, // keys are case-sensitive, as in systemd
		{"MAPVERSION=42", workerproto.Message{MapVersion: 42}},
		{"READY=1\n" + workerproto.MapVersionAck(7), workerproto.Message{Ready: true, MapVersion: 7}},
		{"MAPVERSION=-3", workerproto.Message{}},
		{"MAPVERSION=x", workerproto.Message{}},
		{workerproto.RequestsReport(1234), workerproto.Message{Requests: 1234}},
		{"WATCHDOG=1\nREQUESTS=5", workerproto.Message{Watchdog: true, Requests: 5}},
		{"REQUESTS=-1", workerproto.Message{}},
		{"REQUESTS=1e3", workerproto.Message{}},
	} {
		if got := workerproto.ParseMessage([]byte(tc.in)); got != tc.want {
			t.Errorf("ParseMessage(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

// listen opens a unixgram socket like a manager's NOTIFY_SOCKET.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestNotifyRoundTrip(t *testing.T) {
	for _, tc := range []struct{ kind, addr string }{
		{"path", filepath.Join(t.TempDir(), "notify.sock")},
		{"abstract", fmt.Sprintf("@shardvisor-workerproto-test-%d-%d", os.Getpid(), time.Now().UnixNano())},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			c := listen(t, tc.addr)
			t.Setenv(workerproto.EnvNotifySocket, tc.addr)
			for _, msg := range []string{workerproto.Ready, "STATUS=serving\n" + workerproto.Watchdog, workerproto.Stopping} {
				sent, err := workerproto.Notify(msg)
				if err != nil || !sent {
					t.Fatalf("Notify(%q) = %v, %v", msg, sent, err)
				}
				buf := make([]byte, 4096)
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, _, err := c.ReadFromUnix(buf)
				if err != nil {
					t.Fatal(err)
				}
				if string(buf[:n]) != msg {
					t.Fatalf("received %q, sent %q", buf[:n], msg)
				}
				if got, want := workerproto.ParseMessage(buf[:n]), workerproto.ParseMessage([]byte(msg)); got != want {
					t.Fatalf("parsed %+v, want %+v", got, want)
				}
			}
		})
	}
	t.Run("unset", func(t *testing.T) {
		t.Setenv(workerproto.EnvNotifySocket, "")
		if sent, err := workerproto.Notify(workerproto.Ready); sent || err != nil {
			t.Fatalf("Notify without NOTIFY_SOCKET = %v, %v; want false, nil", sent, err)
		}
	})
	t.Run("nobody listening", func(t *testing.T) {
		t.Setenv(workerproto.EnvNotifySocket, filepath.Join(t.TempDir(), "gone.sock"))
		if sent, err := workerproto.Notify(workerproto.Ready); sent || err == nil || !strings.Contains(err.Error(), "sd_notify") {
			t.Fatalf("Notify to a missing socket = %v, %v; want an sd_notify error", sent, err)
		}
	})
}

func TestWatchdogInterval(t *testing.T) {
	me, other := strconv.Itoa(os.Getpid()), strconv.Itoa(os.Getpid()+1)
	for _, tc := range []struct {
		usec, pid string
		strict    bool
		want      time.Duration
	}{
		{"", "", false, 0},
		{"", me, true, 0},
		{"0", me, true, 0},
		{"-5", me, false, 0},
		{"x", me, false, 0},
		{"2000000", me, true, 2 * time.Second},
		{"2000000", me, false, 2 * time.Second},
		{"2000000", other, true, 0},
		{"2000000", other, false, 0},
		{"2000000", "", false, 2 * time.Second}, // systemd may leave WATCHDOG_PID out
		{"2000000", "", true, 0},                // the supervisor always sets it
	} {
		t.Setenv(workerproto.EnvWatchdogUSec, tc.usec)
		t.Setenv(workerproto.EnvWatchdogPID, tc.pid)
		if got := workerproto.WatchdogInterval(tc.strict); got != tc.want {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q strict=%v: %v, want %v", tc.usec, tc.pid, tc.strict, got, tc.want)
		}
	}
}

func TestListenFDs(t *testing.T) {
	me, other := strconv.Itoa(os.Getpid()), strconv.Itoa(os.Getpid()+1)
	for _, tc := range []struct {
		pid, fds, names string
		want            int
		wantNames       []string
	}{
		{"", "", "", 0, nil},
		{other, "2", "http:admin", 0, nil},
		{me, "", "", 0, nil},
		{me, "0", "", 0, nil},
		{me, "x", "", 0, nil},
		{me, "1", "", 1, nil},
		{me, "2", "http:admin", 2, []string{"http", "admin"}},
		{me, "3", "http", 3, []string{"http"}},
	} {
		t.Setenv(workerproto.EnvListenPID, tc.pid)
		t.Setenv(workerproto.EnvListenFDs, tc.fds)
		t.Setenv(workerproto.EnvListenFDNames, tc.names)
		n, names := workerproto.ListenFDs()
		if n != tc.want || !slices.Equal(names, tc.wantNames) {
			t.Errorf("LISTEN_PID=%q LISTEN_FDS=%q LISTEN_FDNAMES=%q: %d %q, want %d %q", tc.pid, tc.fds, tc.names, n, names, tc.want, tc.wantNames)
		}
	}
}

// A pool config may not set what the supervisor sets: topo's validation
// refuses exactly ReservedEnv.
func TestReservedEnvMatchesPoolConfigValidation(t *testing.T) {
	refused := func(name string) bool {
		c := topo.PoolConfig{Command: "app", Workers: 1, Env: map[string]string{name: "1"}}
		err := c.Validate()
		return err != nil && strings.Contains(err.Error(), name) && strings.Contains(err.Error(), "set by the supervisor")
	}
	for _, name := range workerproto.ReservedEnv() {
		if !workerproto.IsReservedEnv(name) {
			t.Errorf("IsReservedEnv(%s) = false", name)
		}
		if !refused(name) {
			t.Errorf("a pool config may set %s, which the supervisor sets for every worker", name)
		}
	}
	for _, name := range []string{"APP_MODE", "PATH", "SHARDVISOR_APP", "LISTEN_FDS_X"} {
		if workerproto.IsReservedEnv(name) || refused(name) {
			t.Errorf("%s is refused but not reserved", name)
		}
	}
}
